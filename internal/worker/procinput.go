package worker

import (
	"fmt"
	"io"
	"net/http"

	"space/api"
	"space/internal/agent/client"
	"space/internal/agent/proto"
	"space/internal/httpapi"
)

// handleStdin writes the request body to a running command's stdin
// without attaching to it, then closes its stdin with ?eof=true. The body
// is read whole first (at most api.MaxStdinWrite bytes), so a cut request
// writes nothing.
func handleStdin(rw http.ResponseWriter, r *http.Request, a *client.Client) error {
	eof, err := boolParam(r, "eof")
	if err != nil {
		return err
	}
	data, err := io.ReadAll(io.LimitReader(r.Body, api.MaxStdinWrite+1))
	if err != nil {
		return fmt.Errorf("read stdin from the request: %w", err)
	}
	if len(data) > api.MaxStdinWrite {
		return fmt.Errorf("stdin of more than %d bytes in one request (send it in parts, or attach): %w", api.MaxStdinWrite, httpapi.ErrTooLarge)
	}
	p, err := processRef(r, a)
	if err != nil {
		return err
	}
	// In parts the agent's frames hold, in order; the end after the last.
	for {
		n := min(len(data), proto.MaxProcInput)
		last := n == len(data)
		if err := a.ProcessInput(r.Context(), proto.ProcInput{ID: p.ID, Data: data[:n], EOF: eof && last}); err != nil {
			return err
		}
		if data = data[n:]; last {
			break
		}
	}
	rw.WriteHeader(http.StatusNoContent)
	return nil
}

// handleResize sets the terminal size of a running command on a terminal.
func handleResize(rw http.ResponseWriter, r *http.Request, a *client.Client) error {
	var ws api.WinSize
	if err := httpapi.DecodeJSON(r, &ws); err != nil {
		return err
	}
	if ws.Rows == 0 || ws.Cols == 0 {
		return httpapi.Invalid("rows", "a terminal of %d columns and %d rows: want both above 0", ws.Cols, ws.Rows)
	}
	p, err := processRef(r, a)
	if err != nil {
		return err
	}
	if err := a.ProcessInput(r.Context(), proto.ProcInput{ID: p.ID, Resize: &proto.WinSize{Rows: ws.Rows, Cols: ws.Cols}}); err != nil {
		return err
	}
	rw.WriteHeader(http.StatusNoContent)
	return nil
}
