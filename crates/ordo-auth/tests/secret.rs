//! Secret files: what is accepted, what is refused, and that no message
//! ever carries the secret.

use ordo_auth::{Secret, SecretError, SecretSource};
use std::os::unix::fs::PermissionsExt;
use std::path::PathBuf;

fn scratch(name: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("ordo-auth-{}-{name}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    dir
}

fn write(path: &PathBuf, text: &str, mode: u32) {
    std::fs::write(path, text).unwrap();
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(mode)).unwrap();
}

#[test]
fn a_private_file_is_read_and_its_newline_is_not_part_of_the_secret() {
    let dir = scratch("ok");
    let (a, b) = (dir.join("a"), dir.join("b"));
    write(&a, "correct horse battery staple\n", 0o600);
    write(&b, "correct horse battery staple", 0o400);
    let (sa, sb) = (Secret::from_file(&a).unwrap(), Secret::from_file(&b).unwrap());
    assert_eq!(sa.derive("x").tag(&[b"m"]), sb.derive("x").tag(&[b"m"]));
    assert_eq!(format!("{sa:?}"), "Secret(<redacted>)");
}

#[test]
fn unsafe_or_short_files_are_refused_with_a_message_that_names_the_file_not_the_secret() {
    let dir = scratch("bad");
    let wide = dir.join("wide");
    write(&wide, "correct horse battery staple", 0o644);
    let err = Secret::from_file(&wide).unwrap_err();
    assert!(matches!(err, SecretError::Unsafe { .. }), "{err}");
    assert!(err.to_string().contains("chmod 600") && !err.to_string().contains("horse"), "{err}");

    let link = dir.join("link");
    let target = dir.join("target");
    write(&target, "correct horse battery staple", 0o600);
    std::os::unix::fs::symlink(&target, &link).unwrap();
    let err = Secret::from_file(&link).unwrap_err();
    assert!(err.to_string().contains("symbolic link"), "{err}");

    let short = dir.join("short");
    write(&short, "tooshort\n", 0o600);
    assert!(matches!(Secret::from_file(&short), Err(SecretError::Length { len: 8, .. })));

    assert!(matches!(Secret::from_file(&dir.join("missing")), Err(SecretError::Read { .. })));
    assert!(matches!(
        Secret::from_file(&dir),
        Err(SecretError::Unsafe { .. }) | Err(SecretError::Read { .. })
    ));
}

#[test]
fn generated_files_are_private_fresh_and_never_overwritten() {
    let dir = scratch("gen");
    let path = dir.join("cluster.secret");
    let made = Secret::generate_file(&path).unwrap();
    let mode = std::fs::metadata(&path).unwrap().permissions().mode() & 0o777;
    assert_eq!(mode, 0o600);
    let read = Secret::from_file(&path).unwrap();
    assert_eq!(made.derive("k").tag(&[b"m"]), read.derive("k").tag(&[b"m"]));
    assert!(matches!(Secret::generate_file(&path), Err(SecretError::Write { .. })));
    let other = Secret::generate_file(&dir.join("other")).unwrap();
    assert_ne!(made.derive("k").tag(&[b"m"]), other.derive("k").tag(&[b"m"]));
}

#[test]
fn an_environment_variable_works_and_a_missing_one_is_a_clear_error() {
    // SAFETY: this test binary's tests do not read this variable concurrently.
    unsafe { std::env::set_var("ORDO_AUTH_TEST_SECRET", "an env secret of enough bytes\n") };
    let s = Secret::load(&SecretSource::Env("ORDO_AUTH_TEST_SECRET".into())).unwrap();
    let f = Secret::from_bytes(b"an env secret of enough bytes").unwrap();
    assert_eq!(s.derive("k").tag(&[b"m"]), f.derive("k").tag(&[b"m"]));
    let err = Secret::load(&SecretSource::Env("ORDO_AUTH_TEST_NOT_SET".into())).unwrap_err();
    assert_eq!(err.to_string(), "the secret environment variable ORDO_AUTH_TEST_NOT_SET is not set");
}
