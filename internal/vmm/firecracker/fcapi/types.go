package fcapi

// The request and response bodies, as of Firecracker v1.16.1. Optional
// fields carry omitempty so that a zero value is not sent: Firecracker
// rejects fields it does not know, and a PUT resets omitted optional fields
// to their defaults.

// Instance states reported by GET / (InstanceInfo.State).
const (
	StateNotStarted = "Not started"
	StateRunning    = "Running"
	StatePaused     = "Paused"
)

// InstanceInfo is the answer to GET /.
type InstanceInfo struct {
	AppName    string `json:"app_name"`
	ID         string `json:"id"`
	State      string `json:"state"`
	VMMVersion string `json:"vmm_version"`
}

// Logger configures Firecracker's log (PUT /logger), once, before boot or
// snapshot load. Level is Error, Warning, Info, Debug, Trace or Off.
type Logger struct {
	// LogPath is a file or FIFO; before 1.14 it must exist. "" (1.5+)
	// keeps logging to stdout.
	LogPath       string `json:"log_path,omitempty"`
	Level         string `json:"level,omitempty"`
	ShowLevel     bool   `json:"show_level,omitempty"`
	ShowLogOrigin bool   `json:"show_log_origin,omitempty"`
	Module        string `json:"module,omitempty"`
}

// Metrics configures the metrics sink (PUT /metrics), once, before boot or
// snapshot load.
type Metrics struct {
	MetricsPath string `json:"metrics_path"`
}

// BootSource is the kernel to boot (PUT /boot-source). A non-empty
// BootArgs replaces Firecracker's default command line entirely.
type BootSource struct {
	KernelImagePath string `json:"kernel_image_path"`
	BootArgs        string `json:"boot_args,omitempty"`
	InitrdPath      string `json:"initrd_path,omitempty"`
}

// TokenBucket is one rate limit: Size tokens (bytes or operations) per
// RefillTime milliseconds, plus a one-time initial allowance.
type TokenBucket struct {
	Size         int64 `json:"size"`
	RefillTime   int64 `json:"refill_time"`
	OneTimeBurst int64 `json:"one_time_burst,omitempty"`
}

// RateLimiter limits a device's bandwidth and operations; nil buckets are
// unlimited.
type RateLimiter struct {
	Bandwidth *TokenBucket `json:"bandwidth,omitempty"`
	Ops       *TokenBucket `json:"ops,omitempty"`
}

// Drive is a virtio-block device backed by a file (PUT /drives/{DriveID}).
// vhost-user drives are not supported by this client.
type Drive struct {
	DriveID      string       `json:"drive_id"`
	PathOnHost   string       `json:"path_on_host"`
	IsRootDevice bool         `json:"is_root_device"`
	IsReadOnly   bool         `json:"is_read_only"`
	PartUUID     string       `json:"partuuid,omitempty"`
	CacheType    string       `json:"cache_type,omitempty"` // Unsafe (default) or Writeback
	IOEngine     string       `json:"io_engine,omitempty"`  // Sync (default) or Async
	RateLimiter  *RateLimiter `json:"rate_limiter,omitempty"`
}

// DriveUpdate changes a drive after boot (PATCH /drives/{DriveID}): a new
// or resized backing file, or a new rate limiter.
type DriveUpdate struct {
	DriveID     string       `json:"drive_id"`
	PathOnHost  string       `json:"path_on_host,omitempty"`
	RateLimiter *RateLimiter `json:"rate_limiter,omitempty"`
}

// MachineConfig sizes the VM (PUT /machine-config). A PUT resets omitted
// optional fields to their defaults.
type MachineConfig struct {
	VCPUCount       int    `json:"vcpu_count"`
	MemSizeMiB      int    `json:"mem_size_mib"`
	SMT             bool   `json:"smt,omitempty"`
	TrackDirtyPages bool   `json:"track_dirty_pages,omitempty"`
	HugePages       string `json:"huge_pages,omitempty"`   // None or 2M (1.7+)
	CPUTemplate     string `json:"cpu_template,omitempty"` // deprecated
}

// NetworkInterface attaches a tap device (PUT /network-interfaces/{IfaceID}).
type NetworkInterface struct {
	IfaceID       string       `json:"iface_id"`
	HostDevName   string       `json:"host_dev_name"`
	GuestMAC      string       `json:"guest_mac,omitempty"`
	MTU           int          `json:"mtu,omitempty"` // 1.16+
	RxRateLimiter *RateLimiter `json:"rx_rate_limiter,omitempty"`
	TxRateLimiter *RateLimiter `json:"tx_rate_limiter,omitempty"`
}

// Vsock is the VM's one virtio-vsock device (PUT /vsock). Firecracker binds
// UDSPath when it handles the request, so the path must not exist.
type Vsock struct {
	GuestCID uint32 `json:"guest_cid"`
	UDSPath  string `json:"uds_path"`
}

// Entropy is the virtio-rng device (PUT /entropy, 1.4+).
type Entropy struct {
	RateLimiter *RateLimiter `json:"rate_limiter,omitempty"`
}

// Balloon is the memory balloon (PUT /balloon, before boot).
type Balloon struct {
	AmountMiB             int  `json:"amount_mib"`
	DeflateOnOOM          bool `json:"deflate_on_oom"`
	StatsPollingIntervalS int  `json:"stats_polling_interval_s,omitempty"`
	FreePageReporting     bool `json:"free_page_reporting,omitempty"` // 1.14+
	FreePageHinting       bool `json:"free_page_hinting,omitempty"`   // 1.14+, preview
}

// BalloonUpdate sets the balloon's target size after boot (PATCH /balloon).
type BalloonUpdate struct {
	AmountMiB int `json:"amount_mib"`
}

// BalloonStats is the answer to GET /balloon/statistics. The guest fills
// in the optional counters it supports.
type BalloonStats struct {
	TargetPages        int64   `json:"target_pages"`
	ActualPages        int64   `json:"actual_pages"`
	TargetMiB          int64   `json:"target_mib"`
	ActualMiB          int64   `json:"actual_mib"`
	SwapIn             *uint64 `json:"swap_in,omitempty"`
	SwapOut            *uint64 `json:"swap_out,omitempty"`
	MajorFaults        *uint64 `json:"major_faults,omitempty"`
	MinorFaults        *uint64 `json:"minor_faults,omitempty"`
	FreeMemory         *uint64 `json:"free_memory,omitempty"`
	TotalMemory        *uint64 `json:"total_memory,omitempty"`
	AvailableMemory    *uint64 `json:"available_memory,omitempty"`
	DiskCaches         *uint64 `json:"disk_caches,omitempty"`
	HugetlbAllocations *uint64 `json:"hugetlb_allocations,omitempty"`
	HugetlbFailures    *uint64 `json:"hugetlb_failures,omitempty"`
}

// ActionType is a PUT /actions action.
type ActionType string

// The actions.
const (
	InstanceStart  ActionType = "InstanceStart"  // boot; once, before anything post-boot
	SendCtrlAltDel ActionType = "SendCtrlAltDel" // x86: keyboard reset request to the guest
	FlushMetrics   ActionType = "FlushMetrics"   // write metrics now
)

type action struct {
	ActionType ActionType `json:"action_type"`
}

// VMState is a PATCH /vm target state.
type VMState string

// The VM states PATCH /vm accepts.
const (
	Paused  VMState = "Paused"
	Resumed VMState = "Resumed"
)

type vmPatch struct {
	State VMState `json:"state"`
}

// SnapshotType is Full or Diff.
type SnapshotType string

// The snapshot types.
const (
	Full SnapshotType = "Full"
	Diff SnapshotType = "Diff" // developer preview
)

// SnapshotCreate writes the paused VM's state and memory (PUT
// /snapshot/create). Firecracker creates or truncates both files, except
// that a Diff onto an existing memory file of exactly the guest's size is
// merged into it.
type SnapshotCreate struct {
	SnapshotType SnapshotType `json:"snapshot_type,omitempty"`
	SnapshotPath string       `json:"snapshot_path"`
	MemFilePath  string       `json:"mem_file_path"`
}

// Memory backend types for SnapshotLoad.
const (
	BackendFile = "File" // MAP_PRIVATE of the memory file
	BackendUffd = "Uffd" // userfaultfd handler listening on BackendPath
)

// MemBackend says where restored guest memory comes from.
type MemBackend struct {
	BackendType string `json:"backend_type"`
	BackendPath string `json:"backend_path"`
}

// NetworkOverride attaches a saved interface to another tap (1.12+).
type NetworkOverride struct {
	IfaceID     string `json:"iface_id"`
	HostDevName string `json:"host_dev_name"`
}

// VsockOverride binds the saved vsock device at another path (1.16+).
type VsockOverride struct {
	UDSPath string `json:"uds_path"`
}

// SnapshotLoad loads a snapshot into a fresh process (PUT /snapshot/load).
// Set exactly one of MemBackend and the deprecated MemFilePath. Set
// TrackDirtyPages on 1.13+ and EnableDiffSnapshots before (its deprecated
// alias).
type SnapshotLoad struct {
	SnapshotPath        string            `json:"snapshot_path"`
	MemBackend          *MemBackend       `json:"mem_backend,omitempty"`
	MemFilePath         string            `json:"mem_file_path,omitempty"`
	TrackDirtyPages     bool              `json:"track_dirty_pages,omitempty"`
	EnableDiffSnapshots bool              `json:"enable_diff_snapshots,omitempty"`
	ResumeVM            bool              `json:"resume_vm,omitempty"`
	NetworkOverrides    []NetworkOverride `json:"network_overrides,omitempty"`
	VsockOverride       *VsockOverride    `json:"vsock_override,omitempty"`
	ClockRealtime       bool              `json:"clock_realtime,omitempty"`
}
