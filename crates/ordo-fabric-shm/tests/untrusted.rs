//! A local user who plants a file where a peer's region file belongs (a
//! link to a file it controls, a file others may write, a hard link to a
//! shared file) does not get it mapped: the member refuses at once with a
//! clear error, and nothing of the planted file is read or written.

use ordo_fabric_shm::{ShmError, ShmFabric, ShmOptions};
use std::os::unix::fs::PermissionsExt;
use std::path::PathBuf;
use std::time::{Duration, Instant};

const REGION: usize = 4096;

fn dir(name: &str) -> PathBuf {
    let d = std::env::temp_dir().join(format!("ordo-shm-untrusted-{}-{name}", std::process::id()));
    let _ = std::fs::remove_dir_all(&d);
    std::fs::create_dir_all(&d).unwrap();
    d
}

/// Member 0 starts while `plant` put something at member 1's path.
fn start_with_planted(name: &str, plant: impl FnOnce(&PathBuf, &PathBuf)) -> (ShmError, Duration, Vec<u8>) {
    let d = dir(name);
    let mut o = ShmOptions::new(format!("u-{name}"), 0, vec![0, 1], REGION);
    o.dir = d.clone();
    o.open_timeout = Duration::from_secs(10);
    let target = d.join("attacker-controlled");
    std::fs::write(&target, vec![0xAAu8; 8192]).unwrap();
    plant(&o.path_of(1), &target);
    let start = Instant::now();
    let Err(err) = ShmFabric::create(o) else { panic!("a planted file must be refused") };
    let took = start.elapsed();
    (err, took, std::fs::read(&target).unwrap())
}

fn assert_refused(err: &ShmError, took: Duration, target: &[u8], what: &str) {
    assert!(matches!(err, ShmError::Untrusted { member: 1, .. }), "{err}");
    assert!(err.to_string().contains(what), "{err}");
    assert!(took < Duration::from_secs(5), "refused only after waiting {took:?}");
    assert!(target.iter().all(|b| *b == 0xAA), "the planted file was written to");
}

#[test]
fn a_symbolic_link_at_a_peers_path_is_refused() {
    let (err, took, target) = start_with_planted("link", |path, target| {
        std::os::unix::fs::symlink(target, path).unwrap();
    });
    assert_refused(&err, took, &target, "symbolic link");
}

#[test]
fn a_file_others_may_access_is_refused() {
    let (err, took, target) = start_with_planted("mode", |path, _| {
        std::fs::write(path, vec![0u8; 64 + REGION]).unwrap();
        std::fs::set_permissions(path, std::fs::Permissions::from_mode(0o666)).unwrap();
    });
    assert_refused(&err, took, &target, "mode is 666");
}

#[test]
fn a_hard_link_to_a_shared_file_is_refused() {
    let (err, took, target) = start_with_planted("hardlink", |path, target| {
        std::fs::set_permissions(target, std::fs::Permissions::from_mode(0o600)).unwrap();
        std::fs::hard_link(target, path).unwrap();
    });
    assert_refused(&err, took, &target, "hard links");
}

/// Another user's file (made here by handing a file to uid 65534, which
/// needs root; CI and this project's machines run the tests as root).
#[test]
fn another_users_file_is_refused() {
    // SAFETY: geteuid has no preconditions.
    if unsafe { libc::geteuid() } != 0 {
        eprintln!(
            "not root: cannot give a file to another user here; the owner check is covered by the mode and link tests' code path"
        );
        return;
    }
    let (err, took, target) = start_with_planted("owner", |path, _| {
        std::fs::write(path, vec![0u8; 64 + REGION]).unwrap();
        std::fs::set_permissions(path, std::fs::Permissions::from_mode(0o600)).unwrap();
        std::os::unix::fs::chown(path, Some(65534), Some(65534)).unwrap();
    });
    assert_refused(&err, took, &target, "owned by uid 65534");
}

#[test]
fn a_world_writable_directory_without_the_sticky_bit_is_refused() {
    let d = dir("nosticky");
    std::fs::set_permissions(&d, std::fs::Permissions::from_mode(0o777)).unwrap();
    let mut o = ShmOptions::new("u-nosticky", 0, vec![0, 1], REGION);
    o.dir = d.clone();
    let Err(err) = ShmFabric::create(o) else { panic!("a member started in an unsafe directory") };
    assert!(matches!(err, ShmError::Untrusted { member: 0, .. }), "{err}");
    assert!(err.to_string().contains("sticky"), "{err}");
    assert_eq!(std::fs::read_dir(&d).unwrap().count(), 0, "a region file was created there");
}
