// Command testserver is the k8s test tier's test image: a tiny HTTP
// server that tells the tests what a pod can reach.
//
//	GET /          "ok <name>" (name from -name, else the hostname)
//	GET /apiserver the apiserver's version, asked through the in-cluster
//	               config (the kubernetes Service, its ClusterIP)
//	GET /get?url=U the body of GET U, from inside the pod
//
// Usage: testserver [-listen :8080] [-name NAME]
package main

import (
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"io"
	"log"
	"net/http"
	"os"
	"time"

	"k8s.io/client-go/rest"
)

func main() {
	listen := flag.String("listen", ":8080", "address to serve on")
	name := flag.String("name", "", "name to answer / with (default: the hostname)")
	flag.Parse()
	if *name == "" {
		*name, _ = os.Hostname()
	}
	mux := http.NewServeMux()
	mux.HandleFunc("GET /{$}", func(w http.ResponseWriter, r *http.Request) {
		fmt.Fprintf(w, "ok %s\n", *name)
	})
	mux.HandleFunc("GET /apiserver", func(w http.ResponseWriter, r *http.Request) {
		v, err := apiserverVersion(r.Context())
		if err != nil {
			http.Error(w, err.Error(), http.StatusBadGateway)
			return
		}
		fmt.Fprintln(w, v)
	})
	client := &http.Client{Timeout: 10 * time.Second}
	mux.HandleFunc("GET /get", func(w http.ResponseWriter, r *http.Request) {
		resp, err := client.Get(r.URL.Query().Get("url"))
		if err != nil {
			http.Error(w, err.Error(), http.StatusBadGateway)
			return
		}
		defer resp.Body.Close()
		w.WriteHeader(resp.StatusCode)
		io.Copy(w, resp.Body)
	})
	log.Printf("testserver %s listening on %s", *name, *listen)
	log.Fatal(http.ListenAndServe(*listen, mux))
}

func apiserverVersion(ctx context.Context) (string, error) {
	cfg, err := rest.InClusterConfig()
	if err != nil {
		return "", err
	}
	hc, err := rest.HTTPClientFor(cfg)
	if err != nil {
		return "", err
	}
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, cfg.Host+"/version", nil)
	if err != nil {
		return "", err
	}
	resp, err := hc.Do(req)
	if err != nil {
		return "", err
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return "", fmt.Errorf("GET %s/version: %s", cfg.Host, resp.Status)
	}
	var v struct {
		GitVersion string `json:"gitVersion"`
	}
	if err := json.NewDecoder(resp.Body).Decode(&v); err != nil {
		return "", err
	}
	return fmt.Sprintf("%s via %s", v.GitVersion, cfg.Host), nil
}
