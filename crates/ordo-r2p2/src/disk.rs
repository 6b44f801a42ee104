//! `FsDisk`: the real-file backend of `ordo_raft::storage::Disk`.
