package qemu

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"time"
)

// probeTimeout bounds the KVM probe boot. A working KVM gets a stock kernel
// to its first panic (no root file system) in about a second; a broken one
// (such as a paravirtual /dev/kvm that hangs stock guests) never does.
const probeTimeout = 10 * time.Second

// Accel returns the accelerator the driver boots guests with: Config.Accel
// when set, else "kvm" if a probe boot of kernel under KVM runs the kernel
// to completion, else "tcg". The answer is kept for the driver's life and,
// with Config.AccelCache, across processes (keyed by host boot, QEMU binary
// and kernel). The choice is logged once.
func (d *Driver) Accel(ctx context.Context, kernel string) (string, error) {
	if d.accel != "" {
		return d.accel, nil
	}
	key, err := d.probeKey(kernel)
	if err != nil {
		return "", err
	}
	d.mu.Lock()
	if a, ok := d.probed[key]; ok {
		d.mu.Unlock()
		return a, nil
	}
	d.mu.Unlock()
	accel, how := d.cachedAccel(key), "cache"
	if accel == "" {
		accel, how = d.probe(ctx, kernel), "probe"
		if ctx.Err() != nil {
			return "", fmt.Errorf("probe kvm: %w", context.Cause(ctx))
		}
		d.storeAccel(key, accel)
	}
	d.mu.Lock()
	d.probed[key] = accel
	d.mu.Unlock()
	d.log.Info("accelerator chosen", "accel", accel, "by", how)
	return accel, nil
}

// probe boots kernel under KVM without a root file system and reports "kvm"
// when the kernel gets as far as its panic, "tcg" otherwise.
func (d *Driver) probe(ctx context.Context, kernel string) string {
	f, err := os.OpenFile("/dev/kvm", os.O_RDWR, 0)
	if err != nil {
		d.log.Info("kvm unavailable", "err", err)
		return "tcg"
	}
	f.Close()
	pctx, cancel := context.WithTimeout(ctx, probeTimeout)
	defer cancel()
	var out bytes.Buffer
	cmd := exec.CommandContext(pctx, d.bin,
		"-nodefaults", "-no-user-config", "-display", "none", "-no-reboot",
		"-machine", "q35", "-accel", "kvm", "-cpu", "host", "-m", "256",
		"-kernel", kernel, "-append", "console=ttyS0 panic=-1",
		"-serial", "stdio")
	cmd.Env = []string{}
	cmd.Stdout = &limitedBuffer{b: &out, max: 1 << 20}
	cmd.Stderr = cmd.Stdout
	cmd.WaitDelay = time.Second
	start := time.Now()
	err = cmd.Run()
	ok := strings.Contains(out.String(), "Kernel panic")
	d.log.Info("kvm probe boot", "ok", ok, "took", time.Since(start).Round(time.Millisecond), "err", err)
	if ok {
		return "kvm"
	}
	return "tcg"
}

func (d *Driver) probeKey(kernel string) (string, error) {
	fi, err := os.Stat(kernel)
	if err != nil {
		return "", fmt.Errorf("kernel: %w", err)
	}
	boot, _ := os.ReadFile("/proc/sys/kernel/random/boot_id")
	return fmt.Sprintf("%s|%s|%d|%d|%s", strings.TrimSpace(string(boot)), d.bin, fi.Size(), fi.ModTime().UnixNano(), kernel), nil
}

type accelCache map[string]string

func (d *Driver) cachedAccel(key string) string {
	if d.accelCache == "" {
		return ""
	}
	b, err := os.ReadFile(d.accelCache)
	if err != nil {
		return ""
	}
	var c accelCache
	if json.Unmarshal(b, &c) != nil {
		return ""
	}
	return c[key]
}

// storeAccel records a probe result; a lost update only costs a probe.
func (d *Driver) storeAccel(key, accel string) {
	if d.accelCache == "" {
		return
	}
	c := accelCache{}
	if b, err := os.ReadFile(d.accelCache); err == nil {
		json.Unmarshal(b, &c)
	}
	boot := strings.SplitN(key, "|", 2)[0]
	for k := range c {
		if !strings.HasPrefix(k, boot+"|") {
			delete(c, k) // from an earlier boot of the host
		}
	}
	c[key] = accel
	b, _ := json.Marshal(c)
	tmp := d.accelCache + ".tmp"
	err := os.MkdirAll(filepath.Dir(d.accelCache), 0o755)
	if err == nil {
		err = os.WriteFile(tmp, b, 0o644)
	}
	if err == nil {
		err = os.Rename(tmp, d.accelCache)
	}
	if err != nil {
		d.log.Warn("cannot remember the accelerator probe", "err", errors.Join(err, os.Remove(tmp)))
	}
}

// limitedBuffer keeps the first max bytes written to it.
type limitedBuffer struct {
	b   *bytes.Buffer
	max int
}

func (w *limitedBuffer) Write(p []byte) (int, error) {
	if room := w.max - w.b.Len(); room > 0 {
		w.b.Write(p[:min(len(p), room)])
	}
	return len(p), nil
}
