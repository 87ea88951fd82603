// Package rootfs builds guest root filesystem images without mounting
// anything: it unpacks OCI images or runs debootstrap into a directory, then
// packs the directory into an ext4 image with mkfs.ext4 -d.
//
// Exact ownership and device nodes need root: [UnpackOCI] run by another
// user keeps its own ownership, and [Debootstrap] refuses to run.
package rootfs
