package fcapitest

import (
	"bytes"
	"encoding/json"
	"fmt"
	"regexp"
	"sort"

	"space/internal/vmm/firecracker/fcapi"
)

// The fake's own copy of Firecracker's request schemas (v1.16.1, from the
// reference), written independently of package fcapi so that the fake
// checks the client instead of agreeing with it. Pointers tell a missing
// field from a zero one.

type tokenBucket struct {
	Size         *int64 `json:"size"`
	RefillTime   *int64 `json:"refill_time"`
	OneTimeBurst *int64 `json:"one_time_burst"`
}

type rateLimiter struct {
	Bandwidth *tokenBucket `json:"bandwidth"`
	Ops       *tokenBucket `json:"ops"`
}

type loggerBody struct {
	LogPath       *string `json:"log_path"`
	Level         *string `json:"level"`
	ShowLevel     *bool   `json:"show_level"`
	ShowLogOrigin *bool   `json:"show_log_origin"`
	Module        *string `json:"module"`
}

type metricsBody struct {
	MetricsPath *string `json:"metrics_path"`
}

type bootSourceBody struct {
	KernelImagePath *string `json:"kernel_image_path"`
	BootArgs        *string `json:"boot_args"`
	InitrdPath      *string `json:"initrd_path"`
}

type driveBody struct {
	DriveID      *string      `json:"drive_id"`
	PathOnHost   *string      `json:"path_on_host"`
	IsRootDevice *bool        `json:"is_root_device"`
	IsReadOnly   *bool        `json:"is_read_only"`
	PartUUID     *string      `json:"partuuid"`
	CacheType    *string      `json:"cache_type"`
	IOEngine     *string      `json:"io_engine"`
	RateLimiter  *rateLimiter `json:"rate_limiter"`
	Socket       *string      `json:"socket"`
}

type drivePatchBody struct {
	DriveID     *string      `json:"drive_id"`
	PathOnHost  *string      `json:"path_on_host"`
	RateLimiter *rateLimiter `json:"rate_limiter"`
}

type machineBody struct {
	VCPUCount       *int    `json:"vcpu_count"`
	MemSizeMiB      *int    `json:"mem_size_mib"`
	SMT             *bool   `json:"smt"`
	TrackDirtyPages *bool   `json:"track_dirty_pages"`
	HugePages       *string `json:"huge_pages"`
	CPUTemplate     *string `json:"cpu_template"`
}

type nicBody struct {
	IfaceID       *string      `json:"iface_id"`
	HostDevName   *string      `json:"host_dev_name"`
	GuestMAC      *string      `json:"guest_mac"`
	MTU           *int         `json:"mtu"`
	RxRateLimiter *rateLimiter `json:"rx_rate_limiter"`
	TxRateLimiter *rateLimiter `json:"tx_rate_limiter"`
}

type vsockBody struct {
	GuestCID *uint32 `json:"guest_cid"`
	UDSPath  *string `json:"uds_path"`
	VsockID  *string `json:"vsock_id"` // deprecated, still accepted
}

type entropyBody struct {
	RateLimiter *rateLimiter `json:"rate_limiter"`
}

type balloonBody struct {
	AmountMiB             *int  `json:"amount_mib"`
	DeflateOnOOM          *bool `json:"deflate_on_oom"`
	StatsPollingIntervalS *int  `json:"stats_polling_interval_s"`
	FreePageReporting     *bool `json:"free_page_reporting"`
	FreePageHinting       *bool `json:"free_page_hinting"`
}

type balloonPatchBody struct {
	AmountMiB *int `json:"amount_mib"`
}

type actionBody struct {
	ActionType *string `json:"action_type"`
}

type vmBody struct {
	State *string `json:"state"`
}

type snapshotCreateBody struct {
	SnapshotType *string `json:"snapshot_type"`
	SnapshotPath *string `json:"snapshot_path"`
	MemFilePath  *string `json:"mem_file_path"`
}

type memBackendBody struct {
	BackendType *string `json:"backend_type"`
	BackendPath *string `json:"backend_path"`
}

type networkOverrideBody struct {
	IfaceID     *string `json:"iface_id"`
	HostDevName *string `json:"host_dev_name"`
}

type vsockOverrideBody struct {
	UDSPath *string `json:"uds_path"`
}

type snapshotLoadBody struct {
	SnapshotPath        *string               `json:"snapshot_path"`
	MemBackend          *memBackendBody       `json:"mem_backend"`
	MemFilePath         *string               `json:"mem_file_path"`
	TrackDirtyPages     *bool                 `json:"track_dirty_pages"`
	EnableDiffSnapshots *bool                 `json:"enable_diff_snapshots"`
	ResumeVM            *bool                 `json:"resume_vm"`
	NetworkOverrides    []networkOverrideBody `json:"network_overrides"`
	VsockOverride       *vsockOverrideBody    `json:"vsock_override"`
	ClockRealtime       *bool                 `json:"clock_realtime"`
}

// introduced lists, per endpoint, the top-level fields that older
// releases do not know (and so reject as unknown).
var introduced = map[string]map[string][2]int{
	"/machine-config":     {"huge_pages": {1, 7}},
	"/network-interfaces": {"mtu": {1, 16}},
	"/balloon":            {"free_page_reporting": {1, 14}, "free_page_hinting": {1, 14}},
	"/snapshot/load": {
		"mem_backend":       {1, 1},
		"network_overrides": {1, 12},
		"track_dirty_pages": {1, 13},
		"vsock_override":    {1, 16},
		"clock_realtime":    {1, 16},
	},
}

// decode parses body strictly into v: unknown fields are rejected, and so
// are fields newer than version.
func decode(body []byte, endpoint string, version fcapi.Version, v any) error {
	dec := json.NewDecoder(bytes.NewReader(body))
	dec.DisallowUnknownFields()
	if err := dec.Decode(v); err != nil {
		return fmt.Errorf("An error occurred when deserializing the json body of a request: %v.", err)
	}
	if dec.More() {
		return fmt.Errorf("An error occurred when deserializing the json body of a request: trailing data.")
	}
	gates := introduced[endpoint]
	if len(gates) == 0 {
		return nil
	}
	var fields map[string]json.RawMessage
	if err := json.Unmarshal(body, &fields); err != nil {
		return fmt.Errorf("An error occurred when deserializing the json body of a request: %v.", err)
	}
	names := make([]string, 0, len(fields))
	for name := range fields {
		names = append(names, name)
	}
	sort.Strings(names)
	for _, name := range names {
		if min, ok := gates[name]; ok && !version.AtLeast(min[0], min[1]) {
			return fmt.Errorf("An error occurred when deserializing the json body of a request: unknown field `%s`.", name)
		}
	}
	return nil
}

// missing returns an error naming the first required field that is nil.
func missing(fields ...any) error {
	for i := 0; i+1 < len(fields); i += 2 {
		name := fields[i].(string)
		if isNil(fields[i+1]) {
			return fmt.Errorf("An error occurred when deserializing the json body of a request: missing field `%s`.", name)
		}
	}
	return nil
}

func isNil(v any) bool {
	switch p := v.(type) {
	case *string:
		return p == nil
	case *bool:
		return p == nil
	case *int:
		return p == nil
	case *int64:
		return p == nil
	case *uint32:
		return p == nil
	case *memBackendBody:
		return p == nil
	}
	panic(fmt.Sprintf("isNil: unexpected %T", v))
}

func (r *rateLimiter) check() error {
	if r == nil {
		return nil
	}
	for _, b := range []*tokenBucket{r.Bandwidth, r.Ops} {
		if b == nil {
			continue
		}
		if err := missing("size", b.Size, "refill_time", b.RefillTime); err != nil {
			return err
		}
	}
	return nil
}

var (
	idPattern  = regexp.MustCompile(`^[A-Za-z0-9_]+$`)                      // +checklocksignore
	macPattern = regexp.MustCompile(`^[0-9a-fA-F]{2}(:[0-9a-fA-F]{2}){5}$`) // +checklocksignore
)
