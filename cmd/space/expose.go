package main

import (
	"fmt"
	"net"
	"net/http"
	"net/url"
	"strconv"
	"strings"

	"github.com/spf13/cobra"
)

func newSandboxExposeCmd(g *globals) *cobra.Command {
	var listen string
	c := &cobra.Command{
		Use:   "expose ID PORT [--listen ADDR]",
		Short: "Reach an HTTP server in a sandbox",
		Long: `Print the URL at which an HTTP server listening on PORT in the sandbox
answers, through the sandbox's egress gateway: a request there needs the
API key (Authorization: Bearer KEY), which is not passed on.

With --listen, serve the port on a local address instead: http://ADDR/
then reaches http://SANDBOX:PORT/ until interrupted, through the
sandbox's data plane (with its token) when the server names one, else
through the API with the key. Only a sandbox with a network can expose ports.`,
		Args: cobra.ExactArgs(2),
		RunE: func(cmd *cobra.Command, args []string) error {
			port, err := strconv.Atoi(args[1])
			if err != nil || port < 1 || port > 65535 {
				return usagef("port %q: want a number from 1 to 65535", args[1])
			}
			base, _, err := g.apiEndpoint()
			if err != nil {
				return err
			}
			target := strings.TrimSuffix(base, "/") + "/v1/sandboxes/" + url.PathEscape(args[0]) + "/ports/" + strconv.Itoa(port) + "/http/"
			if listen == "" {
				fmt.Fprintln(g.stdout, target)
				return nil
			}
			c, err := g.client()
			if err != nil {
				return err
			}
			l, err := net.Listen("tcp", listen)
			if err != nil {
				return err
			}
			rp := c.PortHandler(args[0], port)
			fmt.Fprintf(g.stderr, "space: http://%s/ reaches port %d of %s (Ctrl-C ends it)\n", l.Addr(), port, args[0])
			srv := &http.Server{Handler: rp}
			go func() {
				<-cmd.Context().Done()
				srv.Close()
			}()
			if err := srv.Serve(l); err != nil && err != http.ErrServerClosed {
				return err
			}
			return nil
		},
	}
	c.Flags().StringVar(&listen, "listen", "", "serve the port on this local `address` (e.g. 127.0.0.1:8080) instead of printing its URL")
	return c
}
