// vcsim for Ferry's tests: the vSphere API simulator of govmomi (Debian's golang-github-vmware-govmomi-dev,
// 0.24.2, which ships the library but not the vcsim command), built offline by scripts/vcsim.sh.
//
// It serves HTTPS with a certificate it makes for itself at start (written to -cert-out, so a client can use
// it as its CA), listens on -l, and prints one JSON line on stdout when it is ready:
//
//	{"url":"https://127.0.0.1:PORT/sdk","cert":"...","datastores":{"LocalDS_0":"/tmp/govcsim-..."}}
//
// SIGTERM/SIGINT remove the datastore directories it created.
//
// It adds changed-block tracking (CBT) to the simulator: QueryChangedDiskAreas and snapshots that freeze their
// disks (the section "Changed-block tracking" below, each rule cited from the vSphere API reference).
// -cbt-max-areas bounds the areas one QueryChangedDiskAreas answer lists, so callers page.
package main

import (
	"bytes"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/sha256"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/hex"
	"encoding/json"
	"encoding/pem"
	"encoding/xml"
	"flag"
	"fmt"
	"io"
	"io/ioutil"
	"log"
	"math/big"
	"net"
	"net/http"
	"net/http/httptest"
	"net/url"
	"os"
	"os/signal"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/vmware/govmomi/simulator"
	"github.com/vmware/govmomi/vim25/mo"
	"github.com/vmware/govmomi/vim25/types"
)

func selfSigned() (tls.Certificate, []byte, error) {
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return tls.Certificate{}, nil, err
	}
	serial, _ := rand.Int(rand.Reader, big.NewInt(1<<62))
	tmpl := x509.Certificate{
		SerialNumber:          serial,
		Subject:               pkix.Name{CommonName: "vcsim", Organization: []string{"Ferry test simulator"}},
		NotBefore:             time.Now().Add(-time.Hour),
		NotAfter:              time.Now().Add(7 * 24 * time.Hour),
		KeyUsage:              x509.KeyUsageDigitalSignature | x509.KeyUsageCertSign,
		ExtKeyUsage:           []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth},
		BasicConstraintsValid: true,
		IsCA:                  true,
		IPAddresses:           []net.IP{net.ParseIP("127.0.0.1"), net.IPv6loopback},
		DNSNames:              []string{"localhost"},
	}
	der, err := x509.CreateCertificate(rand.Reader, &tmpl, &tmpl, &key.PublicKey, key)
	if err != nil {
		return tls.Certificate{}, nil, err
	}
	kder, err := x509.MarshalECPrivateKey(key)
	if err != nil {
		return tls.Certificate{}, nil, err
	}
	certPEM := pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der})
	keyPEM := pem.EncodeToMemory(&pem.Block{Type: "EC PRIVATE KEY", Bytes: kder})
	c, err := tls.X509KeyPair(certPEM, keyPEM)
	return c, certPEM, err
}

// startFront serves the simulator's mux on the address clients are given, with the CBT tracker in front. The
// simulator's own server listens on a loopback port nobody is told about; clients reach its mux through this one,
// which answers QueryChangedDiskAreas itself (no proxy hop: the same mux is called).
func startFront(mux http.Handler, cert tls.Certificate, listen string, maxAreas int) (*http.Server, net.Listener, error) {
	cbt := &cbtTracker{maxAreas: maxAreas, disks: map[string]*cbtDisk{}, snaps: map[string][]*cbtFrozen{}, vmsn: map[string]string{}}
	if cbt.maxAreas < 1 {
		cbt.maxAreas = 1
	}
	simulator.Map.AddHandler(cbt)
	ln, err := net.Listen("tcp", listen)
	if err != nil {
		return nil, nil, err
	}
	front := &http.Server{Handler: cbtHandler(cbt, mux), TLSConfig: &tls.Config{Certificates: []tls.Certificate{cert}, ClientAuth: tls.RequestClientCert}}
	go func() { _ = front.ServeTLS(ln, "", "") }()
	return front, ln, nil
}

func main() {
	listen := flag.String("l", "127.0.0.1:0", "listen address")
	certOut := flag.String("cert-out", "", "write the server certificate (PEM) to this file")
	username := flag.String("username", "user", "login user name")
	password := flag.String("password", "pass", "login password")
	vms := flag.Int("vm", 2, "VMs per host and per resource pool")
	hosts := flag.Int("host", 1, "standalone hosts")
	clusters := flag.Int("cluster", 1, "clusters")
	clusterHosts := flag.Int("cluster-host", 3, "hosts per cluster")
	datastores := flag.Int("ds", 1, "local datastores")
	tools := flag.Bool("tools-running", true, "the VMs the model creates report VMware Tools running (VMs created later do not)")
	idle := flag.Duration("session-idle", 0, "expire sessions idle this long (0 = never)")
	maxAreas := flag.Int("cbt-max-areas", 1024, "most areas one QueryChangedDiskAreas answer lists")
	flag.Parse()

	model := simulator.VPX()
	model.Machine = *vms
	model.Host = *hosts
	model.Cluster = *clusters
	model.ClusterHost = *clusterHosts
	model.Datastore = *datastores
	if err := model.Create(); err != nil {
		fmt.Fprintln(os.Stderr, "vcsim: create:", err)
		os.Exit(1)
	}
	if *tools {
		// govmomi 0.24 reports every VM's tools as not running; a real guest with tools says guestToolsRunning,
		// which is what a guest shutdown needs.
		for _, obj := range simulator.Map.All("VirtualMachine") {
			vm := obj.(*simulator.VirtualMachine)
			vm.Guest.ToolsRunningStatus = string(types.VirtualMachineToolsRunningStatusGuestToolsRunning)
			vm.Guest.ToolsStatus = types.VirtualMachineToolsStatusToolsOk
		}
	}
	if *idle > 0 {
		simulator.SessionIdleTimeout = *idle
	}

	cert, certPEM, err := selfSigned()
	if err != nil {
		fmt.Fprintln(os.Stderr, "vcsim: certificate:", err)
		os.Exit(1)
	}
	if *certOut != "" {
		if err := ioutil.WriteFile(*certOut, certPEM, 0644); err != nil {
			fmt.Fprintln(os.Stderr, "vcsim: cert-out:", err)
			os.Exit(1)
		}
	}
	model.Service.TLS = &tls.Config{Certificates: []tls.Certificate{cert}}
	model.Service.Listen = &url.URL{Host: "127.0.0.1:0", User: url.UserPassword(*username, *password)}
	server := model.Service.NewServer()
	front, ln, err := startFront(model.Service.ServeMux, cert, *listen, *maxAreas)
	if err != nil {
		fmt.Fprintln(os.Stderr, "vcsim: listen:", err)
		os.Exit(1)
	}
	simulator.Map.SessionManager().ServiceHostName = ln.Addr().String()

	dirs := map[string]string{}
	for _, obj := range simulator.Map.All("Datastore") {
		ds := obj.(*simulator.Datastore)
		dirs[ds.Name] = ds.Info.GetDatastoreInfo().Url
	}
	u := url.URL{Scheme: "https", Host: ln.Addr().String(), Path: server.URL.Path}
	line, _ := json.Marshal(map[string]interface{}{"url": u.String(), "cert": *certOut, "datastores": dirs, "pid": os.Getpid()})
	fmt.Println(string(line))

	sig := make(chan os.Signal, 1)
	signal.Notify(sig, syscall.SIGTERM, syscall.SIGINT)
	<-sig
	_ = front.Close()
	server.Close()
	model.Remove()
}

// ---------------------------------------------------------------------------------------------------------------
// Changed-block tracking (CBT), which govmomi 0.24.2's simulator does not have. vSphere API reference, cited by
// the data object or method each rule comes from:
//   - VirtualMachineConfigInfo.changeTrackingEnabled: "Indicates whether changed block tracking for this VM's
//     disks is active"; set by ReconfigVM_Task with VirtualMachineConfigSpec.changeTrackingEnabled (0.24.2's
//     configure() already copies it into config, so ReconfigVM is not touched here).
//   - VirtualDiskFlatVer2BackingInfo.changeId: the change id of the disk in the corresponding snapshot, "used to
//     track incremental changes. See QueryChangedDiskAreas". Each snapshot taken while CBT is on carries one in
//     its config's disk backing, with the backing's fileName naming the disk as frozen at that snapshot.
//   - VirtualMachine.QueryChangedDiskAreas(snapshot, deviceKey, startOffset, changeId): "areas of a virtual disk
//     belonging to this VM that have been modified since a well-defined point in the past. The beginning of the
//     change interval is identified by changeId, while the end of the change interval is implied by the snapshot".
//     "The result may contain false positives ... it is guaranteed that no changes will be missed."
//     Paging: callers start at startOffset 0, "examine the length property in the returned DiskChangeInfo" and
//     call again "until a map for the entire virtual disk has been obtained". snapshot "If not set, changes are
//     computed against the current snapshot ... will only work for virtual machines that are powered off."
//   - DiskChangeInfo: startOffset and length describe the area examined; changedArea lists the modified areas in
//     it and "might be empty"; DiskChangeExtent: start and length in bytes.
//   - changeId "*": every area of the disk that is in use (allocated): VMware's VDDK programming guide ("Changed
//     Block Tracking on Virtual Disks"), not the API reference; to be confirmed on a real vCenter.
//   - Faults: the method declares FileFault and NotFound. Asked on a VM without CBT the simulator raises
//     FileFault (what vCenter answers there, per backup vendors' reports); a change id this disk never issued
//     raises InvalidArgument on changeId ("A specified parameter was not correct: changeId"). Confirm both on a
//     real vCenter.
//
// The model (honest and simple, docs/plans.md "Warm migration: what the simulator proves"):
//   - Only a disk whose backing is a monolithicFlat descriptor with one FLAT extent is tracked (what the tests
//     upload). CreateSnapshot_Task on a VM with CBT on copies each such extent, sparse (holes kept), to
//     <disk>-<snapshot>-flat.vmdk beside a descriptor <disk>-<snapshot>.vmdk naming it; the snapshot's config
//     names that descriptor and a changeId "<tracking id>/<n>". The VM keeps writing to its own file. (A real
//     ESXi freezes the base and redirects writes to a new delta; its frozen state is a sparse delta chain read
//     through VDDK/NFC, which the datastore file service cannot serve as a flat disk.)
//   - Tracking granularity is cbtBlock (64 KiB). At each snapshot the frozen copy is hashed block by block and
//     compared with the previous snapshot's hashes; a differing block is marked changed at snapshot n. A query
//     with change id .../k answers every block marked after k: a superset (false positives allowed, nothing
//     missed), also after the snapshot that issued k was removed (change ids outlive snapshots). Content is
//     compared, not writes counted: a write of the bytes already there is not listed (a real CBT lists it; the
//     copy is the same either way).
//   - Each answer lists at most -cbt-max-areas areas; its length covers what was examined, so a caller pages.
//   - RemoveSnapshot_Task / RemoveAllSnapshots_Task delete the frozen files. A snapshot taken with CBT off
//     forgets the VM's tracking, so older change ids become invalid (vSphere resets CBT when it is disabled).
// ---------------------------------------------------------------------------------------------------------------

const cbtBlock = 64 * 1024

type cbtDisk struct {
	id      string // tracking id, new each time tracking starts
	epoch   int    // snapshots taken since tracking started
	hashes  [][32]byte
	changed []int // per block: the epoch at which it was last seen changed (0: not since tracking started)
}

type cbtFrozen struct {
	vm, id, desc, extent string // desc/extent: local paths of the frozen copy
	key                  int32
	epoch                int
	size                 int64
	alloc                [][2]int64 // allocated byte ranges of the frozen copy
}

type cbtTracker struct {
	mu       sync.Mutex
	maxAreas int
	disks    map[string]*cbtDisk     // vm moref + "/" + device key
	snaps    map[string][]*cbtFrozen // snapshot moref -> its frozen disks
	vmsn     map[string]string       // snapshot moref -> its .vmsn file (local path)
}

func (c *cbtTracker) Reference() types.ManagedObjectReference {
	return types.ManagedObjectReference{Type: "FerryCbtTracker", Value: "ferry-cbt"}
}

// UpdateObject notes the .vmsn file 0.24.2 made for each snapshot of a VM (CreateSnapshot_Task updates the VM
// after making it): 0.24.2's RemoveSnapshot_Task finds it through vm.LayoutEx, which its RefreshStorageInfo
// empties (it stats "[ds] path" as a local path), so every snapshot but the last left its .vmsn behind.
func (c *cbtTracker) UpdateObject(o mo.Reference, _ []types.PropertyChange) {
	vm, ok := o.(*mo.VirtualMachine) // Registry.Update hands over the embedded mo object
	if !ok || vm.LayoutEx == nil {
		return
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	for _, sl := range vm.LayoutEx.Snapshot {
		if _, seen := c.vmsn[sl.Key.Value]; seen {
			continue
		}
		for _, f := range vm.LayoutEx.File {
			if f.Key == sl.DataKey && strings.HasSuffix(f.Name, ".vmsn") {
				if p, _, err := localPath(f.Name); err == nil {
					c.vmsn[sl.Key.Value] = p
				}
			}
		}
	}
}

// PutObject runs inside CreateSnapshot_Task (the VM's lock held by the task): freezes the VM's tracked disks.
func (c *cbtTracker) PutObject(o mo.Reference) {
	snap, ok := o.(*simulator.VirtualMachineSnapshot)
	if !ok {
		return
	}
	vm, ok := simulator.Map.Get(snap.Vm).(*simulator.VirtualMachine)
	if !ok {
		return
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	if vm.Config.ChangeTrackingEnabled == nil || !*vm.Config.ChangeTrackingEnabled {
		for k := range c.disks {
			if strings.HasPrefix(k, vm.Self.Value+"/") {
				delete(c.disks, k)
			}
		}
		return
	}
	devices := make([]types.BaseVirtualDevice, len(snap.Config.Hardware.Device))
	copy(devices, snap.Config.Hardware.Device)
	for i, d := range devices {
		disk, ok := d.(*types.VirtualDisk)
		if !ok {
			continue
		}
		b, ok := disk.Backing.(*types.VirtualDiskFlatVer2BackingInfo)
		if !ok {
			continue
		}
		f, err := c.freeze(vm, snap.Self.Value, disk.Key, b.FileName)
		if err != nil {
			log.Printf("cbt: %s disk %d not tracked: %s", vm.Name, disk.Key, err)
			continue
		}
		nb := *b
		nb.FileName = f.dsPath
		nb.ChangeId = fmt.Sprintf("%s/%d", f.id, f.epoch)
		nd := *disk
		nd.Backing = &nb
		devices[i] = &nd
		c.snaps[snap.Self.Value] = append(c.snaps[snap.Self.Value], &f.cbtFrozen)
	}
	snap.Config.Hardware.Device = devices
}

// RemoveObject: a removed snapshot's frozen files go with it.
func (c *cbtTracker) RemoveObject(ref types.ManagedObjectReference) {
	c.mu.Lock()
	defer c.mu.Unlock()
	for _, f := range c.snaps[ref.Value] {
		_ = os.Remove(f.desc)
		_ = os.Remove(f.extent)
	}
	delete(c.snaps, ref.Value)
	if p, ok := c.vmsn[ref.Value]; ok {
		_ = os.Remove(p)
		delete(c.vmsn, ref.Value)
	}
}

type frozenResult struct {
	cbtFrozen
	dsPath string
}

var extentLine = regexp.MustCompile(`(?m)^(RW|RDONLY)\s+(\d+)\s+FLAT\s+"([^"]+)"\s+0\s*$`)

// localPath maps "[ds] dir/file" to the file behind the simulator's datastore.
func localPath(dsPath string) (string, string, error) {
	m := regexp.MustCompile(`^\[([^\]]+)\]\s*(.*)$`).FindStringSubmatch(dsPath)
	if m == nil {
		return "", "", fmt.Errorf("not a datastore path: %s", dsPath)
	}
	for _, obj := range simulator.Map.All("Datastore") {
		ds := obj.(*simulator.Datastore)
		if ds.Name == m[1] {
			return filepath.Join(ds.Info.GetDatastoreInfo().Url, m[2]), m[1], nil
		}
	}
	return "", "", fmt.Errorf("no datastore %s", m[1])
}

// freeze copies one monolithicFlat disk as of now and compares it with the previous snapshot's hashes.
func (c *cbtTracker) freeze(vm *simulator.VirtualMachine, snap string, key int32, dsPath string) (*frozenResult, error) {
	desc, dsName, err := localPath(dsPath)
	if err != nil {
		return nil, err
	}
	text, err := readHead(desc, 64*1024) // a descriptor is small; a sparse or raw disk is not read whole
	if err != nil {
		return nil, err
	}
	ext := extentLine.FindAllSubmatch(text, -1)
	if len(ext) != 1 || !strings.Contains(string(text), "monolithicFlat") {
		return nil, fmt.Errorf("%s is not a monolithicFlat descriptor with one FLAT extent", dsPath)
	}
	base := strings.TrimSuffix(filepath.Base(desc), ".vmdk")
	extName := fmt.Sprintf("%s-%s-flat.vmdk", base, snap)
	f := &frozenResult{cbtFrozen: cbtFrozen{vm: vm.Self.Value, key: key,
		desc: filepath.Join(filepath.Dir(desc), fmt.Sprintf("%s-%s.vmdk", base, snap)), extent: filepath.Join(filepath.Dir(desc), extName)}}
	f.dsPath = fmt.Sprintf("[%s] %s", dsName, filepath.Join(filepath.Dir(strings.TrimSpace(dsPath[strings.Index(dsPath, "]")+1:])), filepath.Base(f.desc)))
	src := filepath.Join(filepath.Dir(desc), string(ext[0][3]))
	if f.size, f.alloc, err = sparseCopy(src, f.extent); err != nil {
		return nil, err
	}
	newDesc := strings.Replace(string(text), `"`+string(ext[0][3])+`"`, `"`+extName+`"`, 1)
	if err := ioutil.WriteFile(f.desc, []byte(newDesc), 0644); err != nil {
		return nil, err
	}
	hashes, err := blockHashes(f.extent, f.size, f.alloc)
	if err != nil {
		return nil, err
	}
	k := fmt.Sprintf("%s/%d", vm.Self.Value, key)
	d := c.disks[k]
	if d == nil || len(d.hashes) != len(hashes) {
		d = &cbtDisk{id: newTrackingID(), changed: make([]int, len(hashes))}
		c.disks[k] = d
	} else {
		for i := range hashes {
			if hashes[i] != d.hashes[i] {
				d.changed[i] = d.epoch + 1
			}
		}
	}
	d.epoch++
	d.hashes = hashes
	f.id, f.epoch = d.id, d.epoch
	return f, nil
}

func readHead(file string, n int) ([]byte, error) {
	f, err := os.Open(file)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	b := make([]byte, n)
	got, err := io.ReadFull(f, b)
	if err != nil && err != io.ErrUnexpectedEOF && err != io.EOF {
		return nil, err
	}
	return b[:got], nil
}

func newTrackingID() string {
	b := make([]byte, 16)
	_, _ = rand.Read(b)
	h := hex.EncodeToString(b)
	// The shape of a vSphere change id's tracking part: "52 xx xx xx xx xx xx xx-xx xx xx xx xx xx xx xx".
	parts := make([]string, 16)
	for i := range parts {
		parts[i] = h[2*i : 2*i+2]
	}
	return strings.Join(parts[:8], " ") + "-" + strings.Join(parts[8:], " ")
}

// sparseCopy copies src to dst keeping holes (SEEK_DATA/SEEK_HOLE); returns the size and the data ranges.
func sparseCopy(src, dst string) (int64, [][2]int64, error) {
	in, err := os.Open(src)
	if err != nil {
		return 0, nil, err
	}
	defer in.Close()
	st, err := in.Stat()
	if err != nil {
		return 0, nil, err
	}
	out, err := os.OpenFile(dst, os.O_CREATE|os.O_TRUNC|os.O_WRONLY, 0644)
	if err != nil {
		return 0, nil, err
	}
	defer out.Close()
	var alloc [][2]int64
	for off := int64(0); off < st.Size(); {
		data, err := in.Seek(off, 3) // SEEK_DATA
		if err != nil {
			break // ENXIO: no data after off
		}
		hole, err := in.Seek(data, 4) // SEEK_HOLE
		if err != nil {
			hole = st.Size()
		}
		if err := copyRange(in, out, data, hole); err != nil {
			return 0, nil, err
		}
		alloc = append(alloc, [2]int64{data, hole})
		off = hole
	}
	return st.Size(), alloc, out.Truncate(st.Size())
}

func copyRange(in, out *os.File, start, end int64) error {
	buf := make([]byte, 1<<20)
	for off := start; off < end; {
		n := int64(len(buf))
		if end-off < n {
			n = end - off
		}
		got, err := in.ReadAt(buf[:n], off)
		if got > 0 {
			if _, werr := out.WriteAt(buf[:got], off); werr != nil {
				return werr
			}
			off += int64(got)
		}
		if err != nil && err != io.EOF {
			return err
		}
		if got == 0 {
			return io.ErrUnexpectedEOF
		}
	}
	return nil
}

// blockHashes hashes each cbtBlock of a frozen copy; a block in a hole hashes as zeros without being read.
func blockHashes(file string, size int64, alloc [][2]int64) ([][32]byte, error) {
	f, err := os.Open(file)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	n := (size + cbtBlock - 1) / cbtBlock
	out := make([][32]byte, n)
	zero := sha256.Sum256(make([]byte, cbtBlock))
	buf := make([]byte, cbtBlock)
	for i := int64(0); i < n; i++ {
		start, end := i*cbtBlock, (i+1)*cbtBlock
		if end > size {
			end = size
		}
		if !overlaps(alloc, start, end) && end-start == cbtBlock {
			out[i] = zero
			continue
		}
		got, err := f.ReadAt(buf[:end-start], start)
		if err != nil && err != io.EOF {
			return nil, err
		}
		for j := got; j < cbtBlock; j++ {
			buf[j] = 0
		}
		out[i] = sha256.Sum256(buf)
	}
	return out, nil
}

func overlaps(alloc [][2]int64, start, end int64) bool {
	for _, a := range alloc {
		if a[0] < end && start < a[1] {
			return true
		}
	}
	return false
}

type qcdaRequest struct {
	This        types.ManagedObjectReference  `xml:"_this"`
	Snapshot    *types.ManagedObjectReference `xml:"snapshot"`
	DeviceKey   int32                         `xml:"deviceKey"`
	StartOffset int64                         `xml:"startOffset"`
	ChangeId    string                        `xml:"changeId"`
}

type thisOnly struct {
	This types.ManagedObjectReference `xml:"_this"`
}

type soapIn struct {
	Body struct {
		Q         *qcdaRequest `xml:"QueryChangedDiskAreas"`
		RemoveOne *thisOnly    `xml:"RemoveSnapshot_Task"`
		RemoveAll *thisOnly    `xml:"RemoveAllSnapshots_Task"`
	} `xml:"Body"`
}

// detachLayouts runs before 0.24.2's RemoveSnapshot_Task / RemoveAllSnapshots_Task: it takes the snapshots'
// entries out of vm.LayoutEx.Snapshot, so the simulator's removal deletes no file by a layout key (its
// RefreshStorageInfo renumbers vm.LayoutEx.File, and a stale key deleted the VM's own disk descriptor);
// RemoveObject deletes the snapshot's files instead (.vmsn and frozen disks, noted at creation).
func detachLayouts(body *soapIn) {
	var vm *simulator.VirtualMachine
	only := ""
	if body.Body.RemoveOne != nil {
		if s, ok := simulator.Map.Get(body.Body.RemoveOne.This).(*simulator.VirtualMachineSnapshot); ok {
			vm, _ = simulator.Map.Get(s.Vm).(*simulator.VirtualMachine)
			only = s.Self.Value
		}
	} else if body.Body.RemoveAll != nil {
		vm, _ = simulator.Map.Get(body.Body.RemoveAll.This).(*simulator.VirtualMachine)
	}
	if vm == nil {
		return
	}
	simulator.Map.WithLock(vm, func() {
		if vm.LayoutEx == nil {
			return
		}
		kept := vm.LayoutEx.Snapshot[:0]
		for _, sl := range vm.LayoutEx.Snapshot {
			if only != "" && sl.Key.Value != only {
				kept = append(kept, sl)
			}
		}
		vm.LayoutEx.Snapshot = kept
	})
}

type cbtFault struct {
	kind, msg, detail string // detail: the fault's inner XML
}

func (f *cbtFault) Error() string { return f.msg }

func invalidArgument(prop, msg string) *cbtFault {
	return &cbtFault{"InvalidArgument", msg, "<invalidProperty>" + prop + "</invalidProperty>"}
}

// query answers one QueryChangedDiskAreas call (rules cited at the top of this section).
func (c *cbtTracker) query(q *qcdaRequest) (*types.DiskChangeInfo, *cbtFault) {
	vm, ok := simulator.Map.Get(q.This).(*simulator.VirtualMachine)
	if !ok {
		return nil, &cbtFault{"ManagedObjectNotFound", "The object has already been deleted or has not been completely created", "<obj type=\"" + esc(q.This.Type) + "\">" + esc(q.This.Value) + "</obj>"}
	}
	var enabled, poweredOn bool
	var current *types.ManagedObjectReference
	simulator.Map.WithLock(vm, func() {
		enabled = vm.Config.ChangeTrackingEnabled != nil && *vm.Config.ChangeTrackingEnabled
		poweredOn = vm.Runtime.PowerState == types.VirtualMachinePowerStatePoweredOn
		if vm.Snapshot != nil {
			current = vm.Snapshot.CurrentSnapshot
		}
	})
	if !enabled {
		return nil, &cbtFault{"FileFault", fmt.Sprintf("Change tracking is not enabled on virtual machine %s", vm.Name), "<file>" + esc(vm.Config.Files.VmPathName) + "</file>"}
	}
	snap := q.Snapshot
	if snap == nil {
		if poweredOn || current == nil {
			return nil, invalidArgument("snapshot", "A specified parameter was not correct: snapshot (the current state can be queried only on a powered-off VM with a snapshot)")
		}
		snap = current
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	frozen, ok := c.snaps[snap.Value]
	if s, isSnap := simulator.Map.Get(*snap).(*simulator.VirtualMachineSnapshot); !isSnap || s.Vm != vm.Self {
		return nil, &cbtFault{"NotFound", fmt.Sprintf("The snapshot %s is not a snapshot of %s", snap.Value, vm.Name), ""}
	}
	var f *cbtFrozen
	for _, x := range frozen {
		if x.key == q.DeviceKey {
			f = x
		}
	}
	if !ok || f == nil {
		return nil, &cbtFault{"FileFault", fmt.Sprintf("Change tracking is not available for device %d in snapshot %s (not taken with change tracking on a monolithicFlat disk)", q.DeviceKey, snap.Value), "<file>" + esc(vm.Config.Files.VmPathName) + "</file>"}
	}
	if q.StartOffset < 0 || q.StartOffset >= f.size {
		return nil, invalidArgument("startOffset", "A specified parameter was not correct: startOffset")
	}
	return c.areas(f, q)
}

// areas lists the changed (or, for "*", allocated) areas from startOffset, at most maxAreas of them.
func (c *cbtTracker) areas(f *cbtFrozen, q *qcdaRequest) (*types.DiskChangeInfo, *cbtFault) {
	var marked func(block int64) bool
	if q.ChangeId == "*" {
		marked = func(b int64) bool { return overlaps(f.alloc, b*cbtBlock, (b+1)*cbtBlock) }
	} else {
		i := strings.LastIndex(q.ChangeId, "/")
		since, err := strconv.Atoi(q.ChangeId[i+1:])
		d := c.disks[fmt.Sprintf("%s/%d", f.vm, f.key)]
		if i < 0 || err != nil || q.ChangeId[:i] != f.id || since < 1 || since > f.epoch || d == nil || d.id != f.id {
			return nil, invalidArgument("changeId", "A specified parameter was not correct: changeId")
		}
		marked = func(b int64) bool { return d.changed[b] > since }
	}
	info := &types.DiskChangeInfo{StartOffset: q.StartOffset, Length: f.size - q.StartOffset}
	blocks := (f.size + cbtBlock - 1) / cbtBlock
	for b := q.StartOffset / cbtBlock; b < blocks; b++ {
		if !marked(b) {
			continue
		}
		start, end := b*cbtBlock, (b+1)*cbtBlock
		if start < q.StartOffset {
			start = q.StartOffset
		}
		if end > f.size {
			end = f.size
		}
		n := len(info.ChangedArea)
		if n > 0 && info.ChangedArea[n-1].Start+info.ChangedArea[n-1].Length == start {
			info.ChangedArea[n-1].Length += end - start
			continue
		}
		if n == c.maxAreas {
			// A full page: it covers what was examined, up to the last area listed.
			info.Length = start - q.StartOffset
			break
		}
		info.ChangedArea = append(info.ChangedArea, types.DiskChangeExtent{Start: start, Length: end - start})
	}
	return info, nil
}

func esc(s string) string {
	var b bytes.Buffer
	_ = xml.EscapeText(&b, []byte(s))
	return b.String()
}

const soapHead = `<?xml version="1.0" encoding="UTF-8"?><soapenv:Envelope xmlns:soapenc="http://schemas.xmlsoap.org/soap/encoding/" xmlns:soapenv="http://schemas.xmlsoap.org/soap/envelope/" xmlns:xsd="http://www.w3.org/2001/XMLSchema" xmlns:xsi="http://www.w3.org/2001/XMLSchema-instance"><soapenv:Body>`
const soapTail = `</soapenv:Body></soapenv:Envelope>`

func writeCbtAnswer(w http.ResponseWriter, info *types.DiskChangeInfo, f *cbtFault) {
	w.Header().Set("Content-Type", "text/xml; charset=utf-8")
	var b strings.Builder
	b.WriteString(soapHead)
	if f != nil {
		w.WriteHeader(http.StatusInternalServerError)
		fmt.Fprintf(&b, `<soapenv:Fault><faultcode>ServerFaultCode</faultcode><faultstring>%s</faultstring><detail><%sFault xmlns="urn:vim25" xsi:type="%s">%s</%sFault></detail></soapenv:Fault>`, esc(f.msg), f.kind, f.kind, f.detail, f.kind)
	} else {
		fmt.Fprintf(&b, `<QueryChangedDiskAreasResponse xmlns="urn:vim25"><returnval><startOffset>%d</startOffset><length>%d</length>`, info.StartOffset, info.Length)
		for _, a := range info.ChangedArea {
			fmt.Fprintf(&b, `<changedArea><start>%d</start><length>%d</length></changedArea>`, a.Start, a.Length)
		}
		b.WriteString(`</returnval></QueryChangedDiskAreasResponse>`)
	}
	b.WriteString(soapTail)
	_, _ = io.WriteString(w, b.String())
}

// authenticated asks the simulator itself whether the request's session cookie is logged in (CurrentTime needs
// a session), so the intercepted method keeps the simulator's NotAuthenticated rule.
func authenticated(mux http.Handler, r *http.Request) (bool, *httptest.ResponseRecorder) {
	body := soapHead[:strings.Index(soapHead, "<soapenv:Body>")] + `<soapenv:Body><CurrentTime xmlns="urn:vim25"><_this type="ServiceInstance">ServiceInstance</_this></CurrentTime>` + soapTail
	req := httptest.NewRequest(http.MethodPost, r.URL.Path, strings.NewReader(body))
	req.Header.Set("Cookie", r.Header.Get("Cookie"))
	req.Header.Set("Content-Type", "text/xml")
	rec := httptest.NewRecorder()
	mux.ServeHTTP(rec, req)
	return rec.Code == http.StatusOK, rec
}

// cbtHandler sits in front of the simulator's mux: QueryChangedDiskAreas is answered here (0.24.2's
// VirtualMachine has no such method), everything else passes through unchanged.
func cbtHandler(c *cbtTracker, mux http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.Method != http.MethodPost || !strings.HasPrefix(r.URL.Path, "/sdk") {
			mux.ServeHTTP(w, r)
			return
		}
		body, err := ioutil.ReadAll(io.LimitReader(r.Body, 64<<20))
		_ = r.Body.Close()
		if err != nil {
			w.WriteHeader(http.StatusBadRequest)
			return
		}
		var env soapIn
		err = xml.Unmarshal(body, &env)
		if err == nil && env.Body.Q != nil {
			if ok, rec := authenticated(mux, r); !ok {
				for k, v := range rec.Header() {
					w.Header()[k] = v
				}
				w.WriteHeader(rec.Code)
				_, _ = w.Write(rec.Body.Bytes())
				return
			}
			info, f := c.query(env.Body.Q)
			writeCbtAnswer(w, info, f)
			return
		}
		if err == nil && (env.Body.RemoveOne != nil || env.Body.RemoveAll != nil) {
			detachLayouts(&env)
		}
		r.Body = ioutil.NopCloser(bytes.NewReader(body))
		r.ContentLength = int64(len(body))
		mux.ServeHTTP(w, r)
	})
}
