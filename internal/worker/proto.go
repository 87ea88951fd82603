package worker

import "space/internal/workerproto"

// The worker protocol's types, under the names the worker has always used
// for them (package workerproto defines them).
type (
	Spec            = workerproto.Spec
	Network         = workerproto.Network
	SecretGrant     = workerproto.SecretGrant
	Info            = workerproto.Info
	Status          = workerproto.Status
	Capabilities    = workerproto.Capabilities
	CreateRequest   = workerproto.CreateRequest
	SnapshotRequest = workerproto.SnapshotRequest
	SecretsRequest  = workerproto.SecretsRequest
	SnapshotInfo    = workerproto.SnapshotInfo
	LeaseRequest    = workerproto.LeaseRequest
	LeaseReply      = workerproto.LeaseReply
)

// PathPrefix starts every route of the worker API (workerproto.PathPrefix).
const PathPrefix = workerproto.PathPrefix

// EgressLogHeader names the log an egress log answer carries
// (workerproto.EgressLogHeader).
const EgressLogHeader = workerproto.EgressLogHeader

var _ workerproto.Service = (*Worker)(nil)
