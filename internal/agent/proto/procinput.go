package proto

// OpProcInput writes to the stdin of a process of the table, closes its
// stdin, or resizes its terminal, without attaching to it: whoever is
// attached keeps its output. args ProcInput -> Result {}. Agents older
// than the op answer invalid_argument ("unknown op").
const OpProcInput Op = "proc.input"

// MaxProcInput bounds ProcInput.Data: in base64 it fits a request frame.
const MaxProcInput = 512 << 10

// ProcInput is what OpProcInput applies, in this order: Data, then EOF;
// or Resize alone.
type ProcInput struct {
	ID     int64    `json:"id"`
	Data   []byte   `json:"data,omitempty"`
	EOF    bool     `json:"eof,omitempty"` // close stdin (^D on a terminal)
	Resize *WinSize `json:"resize,omitempty"`
}
