# syntax=docker/dockerfile:1
# Ferry images. One build, three runtime targets:
#   app             gateway, daemon, scheduler, notifier (node only; runs as the unprivileged `node` user)
#   worker          app + the packages of img_tool, nbd_access, mount_operations, lvm_tools (scripts/programs.txt)
#   worker-migrate  app + the packages of every capability a whole migration needs (vsphere_access, libvirt_access too)
# The images run the compiled JavaScript (`npm run build` -> dist/) with production dependencies only: no tsx,
# no TypeScript, no test libraries. test/deploy/build.test.ts builds and runs the same contents without Docker.

FROM node:20-bookworm-slim AS deps
WORKDIR /app
COPY package.json package-lock.json ./
# npm ci: exactly what package-lock.json pins (it lists every platform's optional packages).
RUN npm ci --no-audit --no-fund --loglevel=error

# Compile (type errors fail the build) and copy the non-TypeScript files the code reads beside itself.
FROM deps AS build
COPY tsconfig.json tsconfig.build.json ./
COPY platform platform
COPY domain domain
COPY orchestration orchestration
COPY queue queue
COPY services services
COPY scripts scripts
RUN npm run build

FROM node:20-bookworm-slim AS prod-deps
WORKDIR /app
COPY package.json package-lock.json ./
RUN npm ci --omit=dev --no-audit --no-fund --loglevel=error && npm cache clean --force

FROM node:20-bookworm-slim AS app
ENV NODE_ENV=production FERRY_HOST=0.0.0.0 LOG_LEVEL=info
WORKDIR /app
COPY --from=prod-deps /app/node_modules node_modules
COPY package.json package-lock.json ./
COPY --from=build /app/dist dist
RUN ln -s /app/dist/services/converter/ferry-convert.js /usr/local/bin/ferry-convert
USER node
EXPOSE 8000 8080
HEALTHCHECK --interval=15s --timeout=5s --retries=3 CMD node -e "fetch('http://127.0.0.1:'+(process.env.HEALTH_PORT||8000)+'/health').then(r=>process.exit(r.ok?0:1),()=>process.exit(1))"
CMD ["node", "dist/services/gateway/main.js"]

# Worker images. Each installs the Debian packages its capabilities need, read from scripts/programs.txt (the list
# scripts/setup.sh installs from, with a column naming the capabilities that need each program) by
# `node dist/platform/programs.js packages <capabilities>`; test/deploy/images.test.ts checks each target's list, and
# a worker refuses to start when a program of its declared capabilities is missing (services/worker/tools.ts).
#   worker          img_tool conversion workers and the guest-repair workers (nbd_access, mount_operations, lvm_tools)
#   worker-migrate  whole migrations: vSphere export, guest repair, conversion, libvirt import over SSH
FROM app AS worker
USER root
ARG FERRY_IMAGE_CAPABILITIES=img_tool,nbd_access,mount_operations,lvm_tools
RUN apt-get update \
 && DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends $(node dist/platform/programs.js packages "$FERRY_IMAGE_CAPABILITIES") \
 && rm -rf /var/lib/apt/lists/* \
 && mkdir -p /srv/ferry && chown node:node /srv/ferry
# libguestfs runs its appliance with TCG unless /dev/kvm is passed in.
ENV LIBGUESTFS_BACKEND=direct FERRY_WORKER_METRICS_PORT=9100 FERRY_WORKER_CAPABILITIES=img_tool
# img_tool workers run as `node`; nbd_access/mount_operations workers are started as root with privileges
# (compose: worker-guest; k8s: ferry-worker-guest), because NBD devices and mounts need them.
USER node
EXPOSE 9100
HEALTHCHECK --interval=15s --timeout=5s --retries=3 CMD node -e "fetch('http://127.0.0.1:'+(process.env.FERRY_WORKER_METRICS_PORT||9100)+'/health').then(r=>process.exit(r.ok?0:1),()=>process.exit(1))"
CMD ["node", "--initial-old-space-size=128", "dist/services/worker/main.js"]

FROM app AS worker-migrate
USER root
ARG FERRY_IMAGE_CAPABILITIES=img_tool,vsphere_access,libvirt_access,mount_operations,lvm_tools,nbd_access
RUN apt-get update \
 && DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends $(node dist/platform/programs.js packages "$FERRY_IMAGE_CAPABILITIES") \
 && rm -rf /var/lib/apt/lists/* \
 && mkdir -p /srv/ferry /srv/scratch/exports /root/.ssh && chmod 0700 /srv/scratch/exports /root/.ssh
# Runs as root (compose: worker-migrate; k8s: ferry-worker-migrate, privileged) because mount_operations and
# nbd_access need it. The libvirt hosts are reached over qemu+ssh with the key and known_hosts mounted into
# /root/.ssh (docs/deploy.md); a migration's export goes to FERRY_EXPORT_DIR on the scratch volume (/srv/scratch),
# images shared with other workers (shape A exports, convert jobs) to /srv/ferry.
ENV LIBGUESTFS_BACKEND=direct FERRY_WORKER_METRICS_PORT=9100 FERRY_EXPORT_DIR=/srv/scratch/exports \
    FERRY_WORKER_CAPABILITIES=img_tool,vsphere_access,libvirt_access,mount_operations,lvm_tools,nbd_access
EXPOSE 9100
HEALTHCHECK --interval=15s --timeout=5s --retries=3 CMD node -e "fetch('http://127.0.0.1:'+(process.env.FERRY_WORKER_METRICS_PORT||9100)+'/health').then(r=>process.exit(r.ok?0:1),()=>process.exit(1))"
CMD ["node", "--initial-old-space-size=128", "dist/services/worker/main.js"]
