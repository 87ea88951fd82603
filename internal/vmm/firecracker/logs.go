package firecracker

import (
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"os"
	"strings"
	"sync"
	"time"

	"golang.org/x/sys/unix"
)

// openLog opens a log file for appending. Firecracker gets it as stdout
// or stderr: an O_APPEND regular file never blocks, never raises SIGPIPE
// when we are gone (Firecracker exits on SIGPIPE), and survives the
// capper truncating it.
func openLog(path string, truncate bool) (*os.File, error) {
	flag := os.O_WRONLY | os.O_APPEND | os.O_CREATE
	if truncate {
		flag |= os.O_TRUNC
	}
	f, err := os.OpenFile(path, flag, 0o600)
	if err != nil {
		return nil, fmt.Errorf("open log: %w", err)
	}
	return f, nil
}

// makeFIFO creates the FIFO Firecracker logs into, owned by uid:gid (the
// jail's, or -1 to keep ours). Firecracker opens it read-write and
// non-blocking, so while nobody drains it, log lines are dropped rather
// than stalling the VM.
func makeFIFO(path string, uid, gid int) error {
	if err := removeIfExists(path); err != nil {
		return err
	}
	if err := unix.Mkfifo(path, 0o600); err != nil {
		return fmt.Errorf("mkfifo %s: %w", path, err)
	}
	if uid >= 0 {
		if err := os.Lchown(path, uid, gid); err != nil {
			return err
		}
	}
	return nil
}

// logKeeper copies Firecracker's log FIFO into firecracker.log and keeps
// the log files under a size limit. It owns two goroutines.
type logKeeper struct {
	log      *slog.Logger
	limit    int64
	files    []string // capped log files
	fifo     *os.File // read end, opened read-write so it never sees EOF
	out      *os.File // firecracker.log, appended to by the copier
	stop     chan struct{}
	wg       sync.WaitGroup
	interval time.Duration
}

// startLogKeeper starts copying fifo into out (both paths) and capping
// files every interval.
func startLogKeeper(log *slog.Logger, fifoPath, outPath string, files []string, limit int64, interval time.Duration) (*logKeeper, error) {
	fifo, err := os.OpenFile(fifoPath, os.O_RDWR, 0)
	if err != nil {
		return nil, fmt.Errorf("open log fifo: %w", err)
	}
	out, err := openLog(outPath, false)
	if err != nil {
		fifo.Close()
		return nil, err
	}
	k := &logKeeper{log: log, limit: limit, files: files, fifo: fifo, out: out, stop: make(chan struct{}), interval: interval}
	k.wg.Go(k.copy)
	k.wg.Go(k.capLoop)
	return k, nil
}

// drainTime is how long Close lets the copier drain the FIFO.
const drainTime = 50 * time.Millisecond

func (k *logKeeper) copy() {
	// Close's read deadline (or closing the FIFO) ends the copy.
	_, err := io.Copy(k.out, k.fifo)
	if err != nil && !errors.Is(err, os.ErrDeadlineExceeded) && !errors.Is(err, os.ErrClosed) && !errors.Is(err, net.ErrClosed) {
		k.log.Warn("firecracker log copy ended", "err", err)
	}
}

func (k *logKeeper) capLoop() {
	t := time.NewTicker(k.interval)
	defer t.Stop()
	for {
		select {
		case <-k.stop:
			return
		case <-t.C:
		}
		for _, f := range k.files {
			rotated, err := capLog(f, k.limit)
			if err != nil {
				k.log.Warn("cap log", "file", f, "err", err)
			} else if rotated {
				k.log.Info("log rotated", "file", f, "limit_bytes", k.limit)
			}
		}
	}
}

// Close stops both goroutines and closes the files. It first gives the
// copier a moment to drain the FIFO: after an exit, it holds Firecracker's
// last words. Call it once.
func (k *logKeeper) Close() error {
	close(k.stop)
	if k.fifo.SetReadDeadline(time.Now().Add(drainTime)) != nil {
		k.fifo.Close() // not pollable: closing is the only way to stop the copier
	}
	k.wg.Wait()
	err := k.fifo.Close()
	if errors.Is(err, os.ErrClosed) {
		err = nil
	}
	return errors.Join(err, k.out.Close())
}

// rotated is where capLog keeps the previous part of the log at path:
// console.log → console.old.log.
func rotated(path string) string { return strings.TrimSuffix(path, ".log") + ".old.log" }

// capLog keeps a log under limit bytes: once it is larger, its last limit
// bytes go to rotated(path) (replacing it) and the log is truncated.
// Writers must append (O_APPEND) so that they continue at the new end.
// Lines written between the copy and the truncation are lost.
func capLog(path string, limit int64) (done bool, err error) {
	fi, err := os.Stat(path)
	if errors.Is(err, os.ErrNotExist) {
		return false, nil
	}
	if err != nil {
		return false, err
	}
	if fi.Size() <= limit {
		return false, nil
	}
	in, err := os.Open(path)
	if err != nil {
		return false, err
	}
	defer in.Close()
	out, err := os.OpenFile(rotated(path), os.O_WRONLY|os.O_CREATE|os.O_TRUNC, 0o600)
	if err != nil {
		return false, err
	}
	_, err = io.Copy(out, io.NewSectionReader(in, fi.Size()-limit, limit))
	if cerr := out.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		return false, err
	}
	return true, os.Truncate(path, 0)
}

// tail returns up to n bytes from the end of the file at path.
func tail(path string, n int64) []byte {
	f, err := os.Open(path)
	if err != nil {
		return nil
	}
	defer f.Close()
	fi, err := f.Stat()
	if err != nil {
		return nil
	}
	off := max(fi.Size()-n, 0)
	b, _ := io.ReadAll(io.NewSectionReader(f, off, fi.Size()-off))
	return b
}

func removeIfExists(path string) error {
	if err := os.Remove(path); err != nil && !errors.Is(err, os.ErrNotExist) {
		return err
	}
	return nil
}
