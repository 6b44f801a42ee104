//! The cluster secret: where it comes from, how it is kept.

use crate::key::Key;
use std::fmt;
use std::io::{Read as _, Write as _};
use std::os::unix::fs::{MetadataExt, OpenOptionsExt};
use std::path::{Path, PathBuf};
use zeroize::Zeroizing;

/// Fewest bytes a secret may have (128 bits).
pub const MIN_SECRET_LEN: usize = 16;
/// Most bytes read from a secret file or variable.
const MAX_SECRET_LEN: usize = 4096;

/// Where a secret is read from (what a configuration names).
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum SecretSource {
    /// A file holding the secret (trailing newlines are not part of it). It
    /// must be a regular file, not a link, and not readable by group or
    /// others (like an ssh key).
    File(PathBuf),
    /// An environment variable holding the secret.
    Env(String),
}

impl fmt::Display for SecretSource {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            SecretSource::File(path) => write!(f, "file {}", path.display()),
            SecretSource::Env(var) => write!(f, "environment variable {var}"),
        }
    }
}

/// Why a secret could not be had. Messages name the source, never the bytes.
#[derive(Debug, thiserror::Error)]
pub enum SecretError {
    /// The file could not be opened or read.
    #[error("cannot read the secret {source_name}: {error}")]
    Read {
        /// The source, for the message.
        source_name: SecretSource,
        /// The I/O error.
        error: std::io::Error,
    },
    /// The environment variable is not set (or not UTF-8).
    #[error("the secret {0} is not set")]
    EnvMissing(SecretSource),
    /// The file is a link, not a regular file, or readable by others.
    #[error("refusing the secret {source_name}: {why}")]
    Unsafe {
        /// The source, for the message.
        source_name: SecretSource,
        /// What is wrong with it.
        why: String,
    },
    /// Fewer than [`MIN_SECRET_LEN`] or more than 4096 bytes.
    #[error("the secret {source_name} has {len} bytes; it needs {MIN_SECRET_LEN} to 4096")]
    Length {
        /// The source, for the message.
        source_name: SecretSource,
        /// Its length.
        len: usize,
    },
    /// A new secret file could not be written.
    #[error("cannot write a new secret file {path}: {error}")]
    Write {
        /// The file.
        path: PathBuf,
        /// The I/O error.
        error: std::io::Error,
    },
}

/// A shared secret. Its bytes are never printed and are zeroed on drop.
#[derive(Clone)]
pub struct Secret {
    bytes: Zeroizing<Vec<u8>>,
}

impl fmt::Debug for Secret {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("Secret(<redacted>)")
    }
}

impl Secret {
    /// A secret made of `bytes` (at least [`MIN_SECRET_LEN`]).
    pub fn from_bytes(bytes: &[u8]) -> Result<Secret, SecretError> {
        Self::checked(bytes.to_vec(), SecretSource::Env("<bytes>".into()))
    }

    /// A fresh secret: 32 random bytes from the operating system, written
    /// as 64 hex characters (so it can travel in a file or an environment
    /// variable as text; see [`Secret::env_value`]).
    pub fn generate() -> Secret {
        let mut raw = Zeroizing::new([0u8; 32]);
        getrandom::fill(&mut *raw).expect("the operating system's random source works");
        let mut bytes = Zeroizing::new(Vec::with_capacity(64));
        for b in raw.iter() {
            bytes.extend_from_slice(format!("{b:02x}").as_bytes());
        }
        Secret { bytes }
    }

    /// The secret as text, to hand to a child process in an environment
    /// variable ([`SecretSource::Env`]); `None` if it is not UTF-8. Never
    /// log it.
    pub fn env_value(&self) -> Option<&str> {
        std::str::from_utf8(&self.bytes).ok()
    }

    /// Reads the secret from `source`.
    pub fn load(source: &SecretSource) -> Result<Secret, SecretError> {
        match source {
            SecretSource::File(path) => Self::from_file(path),
            SecretSource::Env(var) => {
                let value = std::env::var(var).map_err(|_| SecretError::EnvMissing(source.clone()))?;
                let bytes = value.trim_end_matches(['\n', '\r']).as_bytes().to_vec();
                Self::checked(bytes, source.clone())
            }
        }
    }

    /// Reads a secret file: a regular file (not a link), owned by this
    /// user, not readable or writable by group or others.
    pub fn from_file(path: &Path) -> Result<Secret, SecretError> {
        let source_name = SecretSource::File(path.to_path_buf());
        let read_err = |error| SecretError::Read { source_name: source_name.clone(), error };
        let file = std::fs::OpenOptions::new().read(true).custom_flags(libc::O_NOFOLLOW).open(path).map_err(
            |e| {
                if e.raw_os_error() == Some(libc::ELOOP) {
                    SecretError::Unsafe {
                        source_name: source_name.clone(),
                        why: "it is a symbolic link".into(),
                    }
                } else {
                    read_err(e)
                }
            },
        )?;
        let meta = file.metadata().map_err(read_err)?;
        let unsafe_file = |why: String| SecretError::Unsafe { source_name: source_name.clone(), why };
        if !meta.file_type().is_file() {
            return Err(unsafe_file("it is not a regular file".into()));
        }
        // SAFETY: geteuid has no preconditions.
        let me = unsafe { libc::geteuid() };
        if meta.uid() != me {
            return Err(unsafe_file(format!(
                "it is owned by uid {}, not by this user (uid {me})",
                meta.uid()
            )));
        }
        if meta.mode() & 0o077 != 0 {
            return Err(unsafe_file(format!(
                "its mode is {:o}; group and others must have no access (chmod 600)",
                meta.mode() & 0o777
            )));
        }
        if meta.len() > MAX_SECRET_LEN as u64 + 2 {
            return Err(SecretError::Length { source_name, len: meta.len() as usize });
        }
        let mut bytes = Zeroizing::new(Vec::with_capacity(meta.len() as usize));
        (&file).take(MAX_SECRET_LEN as u64 + 2).read_to_end(&mut bytes).map_err(read_err)?;
        while bytes.last().is_some_and(|b| *b == b'\n' || *b == b'\r') {
            bytes.pop();
        }
        Self::checked(std::mem::take(&mut *bytes), source_name)
    }

    /// Writes a fresh random secret (hex, 64 characters) to a new file
    /// `path` created `0600` (refusing one that exists), and returns it.
    pub fn generate_file(path: &Path) -> Result<Secret, SecretError> {
        let secret = Secret::generate();
        let write_err = |error| SecretError::Write { path: path.to_path_buf(), error };
        let mut file = std::fs::OpenOptions::new()
            .write(true)
            .create_new(true)
            .mode(0o600)
            .custom_flags(libc::O_NOFOLLOW)
            .open(path)
            .map_err(write_err)?;
        file.write_all(&secret.bytes).and_then(|()| file.write_all(b"\n")).map_err(write_err)?;
        file.sync_all().map_err(write_err)?;
        Ok(secret)
    }

    fn checked(bytes: Vec<u8>, source_name: SecretSource) -> Result<Secret, SecretError> {
        let bytes = Zeroizing::new(bytes);
        if bytes.len() < MIN_SECRET_LEN || bytes.len() > MAX_SECRET_LEN {
            return Err(SecretError::Length { source_name, len: bytes.len() });
        }
        Ok(Secret { bytes })
    }

    /// The key for one purpose: HMAC-SHA-256(secret, `label`). Labels in
    /// use are listed in SECURITY.md; each protocol and role has its own.
    pub fn derive(&self, label: &str) -> Key {
        Key::derive(&self.bytes, label)
    }
}
