package e2b

import (
	"bufio"
	"bytes"
	"fmt"
	"io"
	"net/http"
	"strconv"
	"strings"
	"time"

	"space/api"
	"space/client"
)

// metric is E2B's SandboxMetric.
type metric struct {
	Timestamp     string  `json:"timestamp"`
	TimestampUnix int64   `json:"timestampUnix"`
	CPUCount      int     `json:"cpuCount"`
	CPUUsedPct    float64 `json:"cpuUsedPct"`
	MemTotal      int64   `json:"memTotal"`
	MemUsed       int64   `json:"memUsed"`
	MemCache      int64   `json:"memCache"`
	DiskTotal     int64   `json:"diskTotal"`
	DiskUsed      int64   `json:"diskUsed"`
}

// metricsScript samples the guest: its CPU times 200 ms apart, its
// memory and its root file system, with what every Debian system has.
const metricsScript = `head -n1 /proc/stat; sleep 0.2; head -n1 /proc/stat; ` +
	`grep -E '^(MemTotal|MemAvailable|Cached):' /proc/meminfo; df -P -B1 / | tail -n1; nproc`

// rangeSlack is how far, in seconds, a metrics range may miss now and
// still hold the sample taken now.
const rangeSlack = 5

// metrics answers E2B's metrics route from the sandbox's usage history
// (GET /v1/sandboxes/{id}/metrics: a sample every few seconds, kept by
// its worker). A running sandbox whose history is still empty (created
// a moment ago) gets one sample of the guest taken now, if the range
// holds now.

func (s *Server) metrics(w http.ResponseWriter, r *http.Request, c *client.Client) {
	sb, ok := pathSandboxInfo(w, r, c)
	if !ok {
		return
	}
	id := sb.ID
	// The one sample is taken now: a range (unix seconds) that ends before
	// now or starts after it holds none. The bounds are second-precision
	// and the caller's clock is not ours: within rangeSlack counts as now.
	now := time.Now().UTC()
	var bounds [2]int64
	for i, name := range []string{"start", "end"} {
		v := r.URL.Query().Get(name)
		if v == "" {
			continue
		}
		n, err := strconv.ParseInt(v, 10, 64)
		if err != nil {
			writeAPIError(w, badRequest("%s %.32q: want unix seconds", name, v))
			return
		}
		bounds[i] = n
	}
	var start, end time.Time
	if bounds[0] != 0 {
		start = time.Unix(bounds[0], 0)
	}
	if bounds[1] != 0 {
		end = time.Unix(bounds[1], 0).Add(time.Second - 1) // the whole last second
	}
	if bounds[0] != 0 && bounds[1] != 0 && bounds[1] < bounds[0] {
		writeAPIError(w, badRequest("end %d is before start %d", bounds[1], bounds[0]))
		return
	}
	hist, err := c.Metrics(r.Context(), id, start, end)
	if err != nil {
		writeAPIError(w, err)
		return
	}
	var series []metric
	for _, u := range hist.Samples {
		if u.MemTotalBytes > 0 { // the guest's figures, not the host's alone
			series = append(series, metricOf(u))
		}
	}
	if len(series) > 0 {
		writeJSON(w, http.StatusOK, series)
		return
	}
	if sb.State != "running" || bounds[0] != 0 && bounds[0] > now.Unix()+rangeSlack || bounds[1] != 0 && bounds[1] < now.Unix()-rangeSlack {
		writeJSON(w, http.StatusOK, []metric{})
		return
	}
	var out, errOut bytes.Buffer
	exit, err := c.ExecEvents(r.Context(), id, api.Exec{Shell: metricsScript, User: "root", TimeoutSeconds: 10}, &out, &errOut)
	if err == nil && exit.Code != 0 {
		err = fmt.Errorf("sample the sandbox: exit %d: %s", exit.Code, strings.TrimSpace(errOut.String()))
	}
	var m metric
	if err == nil {
		m, err = parseMetrics(&out)
	}
	if err != nil {
		writeAPIError(w, err)
		return
	}
	m.Timestamp, m.TimestampUnix = now.Format(time.RFC3339), now.Unix()
	writeJSON(w, http.StatusOK, []metric{m})
}

// metricOf is E2B's form of a usage sample.
func metricOf(u api.UsageSample) metric {
	return metric{
		Timestamp: u.Time.UTC().Format(time.RFC3339), TimestampUnix: u.Time.Unix(),
		CPUCount: u.CPUs, CPUUsedPct: u.CPUUsedPct,
		MemTotal: u.MemTotalBytes, MemUsed: u.MemUsedBytes, MemCache: u.MemCacheBytes,
		DiskTotal: u.DiskTotalBytes, DiskUsed: u.DiskUsedBytes,
	}
}

// parseMetrics reads metricsScript's output.
func parseMetrics(r io.Reader) (metric, error) {
	var m metric
	var cpu [][]int64
	sc := bufio.NewScanner(r)
	for sc.Scan() {
		f := strings.Fields(sc.Text())
		switch {
		case len(f) > 4 && f[0] == "cpu":
			var times []int64
			for _, v := range f[1:] {
				n, err := strconv.ParseInt(v, 10, 64)
				if err != nil {
					return m, fmt.Errorf("sample the sandbox: /proc/stat %q", sc.Text())
				}
				times = append(times, n)
			}
			cpu = append(cpu, times)
		case len(f) == 3 && strings.HasSuffix(f[0], ":") && f[2] == "kB":
			n, _ := strconv.ParseInt(f[1], 10, 64)
			switch f[0] {
			case "MemTotal:":
				m.MemTotal = n << 10
			case "MemAvailable:":
				m.MemUsed = -n << 10 // total minus available, below
			case "Cached:":
				m.MemCache = n << 10
			}
		case len(f) == 6 && strings.HasSuffix(f[4], "%"):
			m.DiskTotal, _ = strconv.ParseInt(f[1], 10, 64)
			m.DiskUsed, _ = strconv.ParseInt(f[2], 10, 64)
		case len(f) == 1:
			m.CPUCount, _ = strconv.Atoi(f[0])
		}
	}
	if len(cpu) != 2 || m.MemTotal == 0 || m.CPUCount == 0 {
		return m, fmt.Errorf("sample the sandbox: unexpected output")
	}
	m.MemUsed += m.MemTotal
	// Busy is every time but idle and iowait (the 4th and 5th).
	var busy, total int64
	for i := range cpu[1] {
		if i >= len(cpu[0]) {
			break
		}
		d := cpu[1][i] - cpu[0][i]
		if i < 8 { // user nice system idle iowait irq softirq steal; guest times are in user already
			total += d
			if i != 3 && i != 4 {
				busy += d
			}
		}
	}
	if total > 0 {
		m.CPUUsedPct = float64(int64(float64(busy)/float64(total)*10000)) / 100
	}
	return m, nil
}

// teamMetric is E2B's TeamMetric.
type teamMetric struct {
	ConcurrentSandboxes int     `json:"concurrentSandboxes"`
	SandboxStartRate    float64 `json:"sandboxStartRate"` // per second
	Timestamp           string  `json:"timestamp"`
	TimestampUnix       int64   `json:"timestampUnix"`
}

// teamMetrics answers E2B's team metrics route from SPACE's (GET
// /v1/metrics): the caller's team's running sandboxes and start rate,
// whatever team the path names (a key reaches its own team only).
func (s *Server) teamMetrics(w http.ResponseWriter, r *http.Request, c *client.Client) {
	var bounds [2]time.Time
	for i, name := range []string{"start", "end"} {
		v := r.URL.Query().Get(name)
		if v == "" {
			continue
		}
		n, err := strconv.ParseInt(v, 10, 64)
		if err != nil || n < 0 {
			writeAPIError(w, badRequest("%s %.32q: want unix seconds", name, v))
			return
		}
		bounds[i] = time.Unix(n, 0)
	}
	m, err := c.TeamMetrics(r.Context(), bounds[0], bounds[1], 0)
	if err != nil {
		writeAPIError(w, err)
		return
	}
	out := make([]teamMetric, 0, len(m.Points))
	for _, p := range m.Points {
		out = append(out, teamMetric{ConcurrentSandboxes: p.Running, SandboxStartRate: float64(p.Started) / m.StepSeconds,
			Timestamp: p.Time.UTC().Format(time.RFC3339), TimestampUnix: p.Time.Unix()})
	}
	writeJSON(w, http.StatusOK, out)
}
