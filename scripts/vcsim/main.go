// vcsim for Ferry's tests: the vSphere API simulator of govmomi (Debian's golang-github-vmware-govmomi-dev,
// 0.24.2, which ships the library but not the vcsim command), built offline by scripts/vcsim.sh.
//
// It serves HTTPS with a certificate it makes for itself at start (written to -cert-out, so a client can use
// it as its CA), listens on -l, and prints one JSON line on stdout when it is ready:
//   {"url":"https://127.0.0.1:PORT/sdk","cert":"...","datastores":{"LocalDS_0":"/tmp/govcsim-..."}}
// SIGTERM/SIGINT remove the datastore directories it created.
package main

import (
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/json"
	"encoding/pem"
	"flag"
	"fmt"
	"io/ioutil"
	"math/big"
	"net"
	"net/url"
	"os"
	"os/signal"
	"syscall"
	"time"

	"github.com/vmware/govmomi/simulator"
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
	model.Service.Listen = &url.URL{Host: *listen, User: url.UserPassword(*username, *password)}
	server := model.Service.NewServer()

	dirs := map[string]string{}
	for _, obj := range simulator.Map.All("Datastore") {
		ds := obj.(*simulator.Datastore)
		dirs[ds.Name] = ds.Info.GetDatastoreInfo().Url
	}
	u := *server.URL
	u.User = nil
	line, _ := json.Marshal(map[string]interface{}{"url": u.String(), "cert": *certOut, "datastores": dirs, "pid": os.Getpid()})
	fmt.Println(string(line))

	sig := make(chan os.Signal, 1)
	signal.Notify(sig, syscall.SIGTERM, syscall.SIGINT)
	<-sig
	server.Close()
	model.Remove()
}
