//! The durable Raft log (segmented files with checksums, group commit,
//! recovery) over a [`Disk`] abstraction. Written by the storage work.
