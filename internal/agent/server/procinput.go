package server

import (
	"fmt"

	"space/internal/agent/proto"
	"space/internal/errkind"
)

// procInput applies a ProcInput to a process of the table: bytes to its
// stdin and then its end, or a new terminal size. A process that has
// exited, or whose stdin is closed or was never open, refuses input with
// failed_precondition, so a caller learns its bytes went nowhere.
func (s *Server) procInput(a proto.ProcInput) error {
	if len(a.Data) > proto.MaxProcInput {
		return fmt.Errorf("input to process %d: %d bytes, more than %d: %w", a.ID, len(a.Data), proto.MaxProcInput, errkind.InvalidArgument)
	}
	p, err := s.procs.get(a.ID)
	if err != nil {
		return err
	}
	p.mu.Lock()
	exited, closed := p.exit != nil, p.stdinClosed
	p.mu.Unlock()
	switch {
	case exited:
		return fmt.Errorf("process %d has exited: %w", a.ID, errkind.FailedPrecondition)
	case a.Resize != nil:
		if !p.isPTY {
			return fmt.Errorf("process %d is not on a terminal: %w", a.ID, errkind.FailedPrecondition)
		}
		if a.Resize.Rows == 0 || a.Resize.Cols == 0 {
			return fmt.Errorf("resize process %d to %dx%d: %w", a.ID, a.Resize.Cols, a.Resize.Rows, errkind.InvalidArgument)
		}
		p.resize(*a.Resize)
		return nil
	case p.stdin == nil || closed:
		return fmt.Errorf("process %d has no open stdin (start it with stdin): %w", a.ID, errkind.FailedPrecondition)
	}
	if len(a.Data) > 0 {
		p.writeStdin(a.Data)
	}
	if a.EOF {
		p.closeStdin()
	}
	return nil
}
