// Command tplsrv is the only program of the template tests' OCI image: a
// static binary that serves files over HTTP and does the few things the
// tests' steps and checks need, in an image with no shell.
package main

import (
	"fmt"
	"io"
	"net/http"
	"os"
	"strconv"
)

func main() {
	if len(os.Args) < 2 {
		fmt.Fprintln(os.Stderr, "usage: tplsrv serve ADDR DIR | get URL | write PATH TEXT | env NAME | uid | pwd | fail CODE")
		os.Exit(2)
	}
	args := os.Args[2:]
	switch os.Args[1] {
	case "serve":
		fmt.Println("serving", args[1], "on", args[0])
		err := http.ListenAndServe(args[0], http.FileServer(http.Dir(args[1])))
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	case "get":
		resp, err := http.Get(args[0])
		if err != nil {
			fmt.Fprintln(os.Stderr, err)
			os.Exit(1)
		}
		defer resp.Body.Close()
		if resp.StatusCode != http.StatusOK {
			fmt.Fprintln(os.Stderr, resp.Status)
			os.Exit(1)
		}
		io.Copy(os.Stdout, resp.Body)
	case "write":
		if err := os.WriteFile(args[0], []byte(args[1]), 0o644); err != nil {
			fmt.Fprintln(os.Stderr, err)
			os.Exit(1)
		}
	case "env":
		fmt.Print(os.Getenv(args[0]))
	case "uid":
		fmt.Print(os.Getuid())
	case "pwd":
		wd, _ := os.Getwd()
		fmt.Print(wd)
	case "fail":
		code, _ := strconv.Atoi(args[0])
		fmt.Fprintln(os.Stderr, "failing on purpose with", code)
		os.Exit(code)
	default:
		fmt.Fprintln(os.Stderr, "unknown command", os.Args[1])
		os.Exit(2)
	}
}
