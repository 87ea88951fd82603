package proto

import (
	"bufio"
	"bytes"
	"encoding/json"
	"errors"
	"io"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"

	"space/internal/errkind"
)

func TestFrameRoundTrip(t *testing.T) {
	var buf bytes.Buffer
	want := []Frame{
		{TypeRequest, []byte(`{"op":"health"}`)},
		{TypeStdout, bytes.Repeat([]byte{0, 1, 2, 255}, 1000)},
		{TypeEnd, []byte{}},
		{TypeData, make([]byte, MaxFrame)},
	}
	for _, f := range want {
		if err := WriteFrame(&buf, f.Type, f.Payload); err != nil {
			t.Fatalf("WriteFrame(%v) = %v", f.Type, err)
		}
	}
	r := NewReader(&buf, 0)
	var got []Frame
	for {
		f, err := r.Next()
		if err == io.EOF {
			break
		}
		if err != nil {
			t.Fatalf("Next() = %v", err)
		}
		got = append(got, f)
	}
	if diff := cmp.Diff(want, got); diff != "" {
		t.Errorf("frames differ (-want +got):\n%s", diff)
	}
}

func TestReaderRejects(t *testing.T) {
	tests := []struct {
		name  string
		input []byte
		want  error
	}{
		{"oversized", []byte{byte(TypeData), 0x00, 0x10, 0x00, 0x01}, ErrFrameTooLarge},
		{"huge length", []byte{byte(TypeData), 0xff, 0xff, 0xff, 0xff}, ErrFrameTooLarge},
		{"unknown type", []byte{200, 0, 0, 0, 0}, ErrUnknownType},
		{"zero type", []byte{0, 0, 0, 0, 0}, ErrUnknownType},
		{"truncated payload", []byte{byte(TypeData), 0, 0, 0, 9, 1, 2}, io.ErrUnexpectedEOF},
		{"truncated header", []byte{byte(TypeData), 0}, io.ErrUnexpectedEOF},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			_, err := NewReader(bytes.NewReader(tt.input), 0).Next()
			if !errors.Is(err, tt.want) {
				t.Errorf("Next() = %v, want %v", err, tt.want)
			}
		})
	}
}

func TestDecodeJSON(t *testing.T) {
	var req Request
	if err := DecodeJSON(Frame{TypeRequest, []byte(`{"op":"exec","args":{"argv":["true"]}}`)}, 0, &req); err != nil {
		t.Fatalf("DecodeJSON(valid) = %v", err)
	}
	for _, bad := range []string{`{"op":1}`, `{"op":"x","zzz":1}`, `{"op":"x"} {}`, `not json`, strings.Repeat(" ", MaxControl+1)} {
		err := DecodeJSON(Frame{TypeRequest, []byte(bad)}, 0, &req)
		if !errors.Is(err, errkind.InvalidArgument) {
			t.Errorf("DecodeJSON(%.20q) = %v, want InvalidArgument", bad, err)
		}
	}
}

// TestProcStartJSON pins the wire form of proc.start arguments: the exec
// request's fields sit beside kill_on_detach and attach in one object.
func TestProcStartJSON(t *testing.T) {
	want := ProcStart{ExecRequest: ExecRequest{Argv: []string{"sleep", "9"}, TimeoutMS: 5}, KillOnDetach: true, Attach: true}
	const wire = `{"argv":["sleep","9"],"timeout_ms":5,"kill_on_detach":true,"attach":true}`
	var got ProcStart
	if err := DecodeJSON(Frame{TypeRequest, []byte(wire)}, 0, &got); err != nil {
		t.Fatalf("DecodeJSON(%s) = %v", wire, err)
	}
	if diff := cmp.Diff(want, got); diff != "" {
		t.Errorf("DecodeJSON(%s) differs (-want +got):\n%s", wire, diff)
	}
	b, err := json.Marshal(want)
	if err != nil || string(b) != wire {
		t.Errorf("json.Marshal(%+v) = %s, %v; want %s", want, b, err, wire)
	}
}

func TestHandshake(t *testing.T) {
	nonce := "0123456789abcdef0123"
	stale := "garbage\x00\x01 from before SPACE-READY 1 ffffffffffffffffff old\n" +
		strings.Repeat("x", 10000) + "partial-no-newline "
	br := bufio.NewReaderSize(strings.NewReader(stale+string(Ready{1, nonce, "v1.2"}.Line())+"tail"), 4096)
	got, err := ReadReady(br, nonce, MaxHandshakeScan)
	if err != nil {
		t.Fatalf("ReadReady() = %v", err)
	}
	if want := (Ready{1, nonce, "v1.2"}); got != want {
		t.Errorf("ReadReady() = %+v, want %+v", got, want)
	}
	if rest, _ := io.ReadAll(br); string(rest) != "tail" {
		t.Errorf("bytes after handshake = %q, want %q", rest, "tail")
	}

	br = bufio.NewReader(strings.NewReader("old stuff\n" + string(Hello{1, nonce}.Line())))
	h, err := ReadHello(br, 0)
	if err != nil || h != (Hello{1, nonce}) {
		t.Errorf("ReadHello() = %+v, %v", h, err)
	}

	for _, bad := range []string{"SPACE-HELLO 1 short\n", "SPACE-HELLO x " + nonce + "\n", "SPACE-HELLO 1 " + strings.ToUpper(nonce) + "\n"} {
		if _, err := ReadHello(bufio.NewReader(strings.NewReader(bad)), 0); !errors.Is(err, ErrHandshake) {
			t.Errorf("ReadHello(%q) = %v, want ErrHandshake", bad, err)
		}
	}
	_, err = ReadReady(bufio.NewReader(strings.NewReader(strings.Repeat("z", 1<<16))), nonce, 1000)
	if !errors.Is(err, ErrHandshake) {
		t.Errorf("ReadReady(endless garbage) = %v, want ErrHandshake", err)
	}
}

// FuzzReader feeds arbitrary bytes to the frame and JSON decoders the host
// uses on guest output: they must return errors, never panic or allocate
// beyond the frame limit.
func FuzzReader(f *testing.F) {
	f.Add(AppendFrame(nil, TypeResult, []byte(`{"agent_version":"x","protocol":1}`)))
	f.Add(AppendFrame(AppendFrame(nil, TypeStdout, []byte("hi")), TypeExit, []byte(`{"code":137,"signal":9}`)))
	f.Add(AppendFrame(nil, TypeError, []byte(`{"code":"not_found","message":"m"}`)))
	f.Add(AppendFrame(nil, TypeResult, []byte(`{"entries":[{"name":"a","type":"file","size":1}]}`)))
	f.Add(AppendFrame(nil, TypeResult, []byte(`{"processes":[{"id":1,"pid":9,"argv":["sleep","9"],"cwd":"/","started_unix_ms":1,"running":false,"exit":{"code":0},"attached":false,"dropped_bytes":0,"buffered_bytes":3}]}`)))
	f.Add([]byte{byte(TypeData), 0xff, 0xff, 0xff, 0xff})
	f.Add([]byte("SPACE-READY 1 0123456789abcdef agent\n"))
	f.Fuzz(func(t *testing.T, data []byte) {
		r := NewReader(bytes.NewReader(data), 0)
		for i := 0; i < 64; i++ {
			fr, err := r.Next()
			if err != nil {
				return
			}
			if len(fr.Payload) > MaxFrame {
				t.Fatalf("payload of %d bytes passed the limit", len(fr.Payload))
			}
			var e Error
			var x Exit
			var l ListBatch
			var h Health
			var pl ProcList
			var pi ProcInfo
			_ = DecodeJSON(fr, MaxFrame, &pl)
			_ = DecodeJSON(fr, MaxFrame, &pi)
			_ = DecodeJSON(fr, 0, &e)
			_ = DecodeJSON(fr, 0, &x)
			_ = DecodeJSON(fr, MaxFrame, &l)
			_ = DecodeJSON(fr, 0, &h)
			_ = e.Err()
		}
		_, _ = ReadReady(bufio.NewReader(bytes.NewReader(data)), "0123456789abcdef", 1<<16)
	})
}

func TestReadStart(t *testing.T) {
	cur := Hello{1, "0123456789abcdef0000"}
	other := Hello{1, "0123456789abcdef1111"}
	tests := []struct {
		name  string
		input string
		want  *Hello
	}{
		{"start", string(cur.Line()) + string(cur.Line()) + string(StartLine(cur.Nonce)), nil},
		{"new host", "junk\n" + string(StartLine(other.Nonce)) + string(other.Line()), &other},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got, err := ReadStart(bufio.NewReader(strings.NewReader(tt.input)), cur)
			if err != nil {
				t.Fatalf("ReadStart() = %v", err)
			}
			if diff := cmp.Diff(tt.want, got); diff != "" {
				t.Errorf("ReadStart() differs (-want +got):\n%s", diff)
			}
		})
	}
}
