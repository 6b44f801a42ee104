//! `ordo kv serve` (one replica of the replicated hash table per process,
//! spoken as Redis) and the `--kv` flavour of `ordo cluster up`.

use clap::{Args, Subcommand};
use ordo_kv::KvServer;
use std::time::{Duration, Instant};

#[derive(Subcommand)]
pub enum Kv {
    /// Serve one replica: the acuerdo member of `group.members` over the
    /// configured fabric, and a RESP (Redis) server on `kv.listen`.
    Serve(ServeArgs),
}

#[derive(Args)]
pub struct ServeArgs {
    #[command(flatten)]
    pub config: crate::ConfigArgs,
    /// Stop after this many seconds (default: until SIGTERM/SIGINT).
    #[arg(long)]
    pub for_s: Option<u64>,
}

static TERMINATE: std::sync::atomic::AtomicBool = std::sync::atomic::AtomicBool::new(false);

extern "C" fn on_terminate(_: libc::c_int) {
    TERMINATE.store(true, std::sync::atomic::Ordering::Release);
}

pub fn main(cmd: Kv) -> Result<(), String> {
    match cmd {
        Kv::Serve(args) => serve(args),
    }
}

fn serve(args: ServeArgs) -> Result<(), String> {
    // SAFETY: the handler only stores to an atomic (async-signal-safe).
    unsafe {
        libc::signal(libc::SIGTERM, on_terminate as *const () as libc::sighandler_t);
        libc::signal(libc::SIGINT, on_terminate as *const () as libc::sighandler_t);
    }
    let config = crate::load_config(&args.config)?;
    let server = KvServer::start(&config).map_err(|e| format!("replica {}: {e}", config.member.id))?;
    let auth = if config.security.client_secret_file.is_some() || config.security.client_secret_env.is_some()
    {
        " -a PASSWORD"
    } else {
        ""
    };
    println!(
        "ordo kv: replica {} of {:?} on the {:?} fabric; RESP on {} (redis-cli -p {}{auth})",
        config.member.id,
        config.group.members,
        config.fabric.backend,
        server.local_addr(),
        server.local_addr().port(),
    );
    let start = Instant::now();
    let mut role = String::new();
    while !TERMINATE.load(std::sync::atomic::Ordering::Acquire)
        && args.for_s.is_none_or(|s| start.elapsed() < Duration::from_secs(s))
    {
        std::thread::sleep(Duration::from_millis(100));
        let st = server.status();
        if st.state != role && !st.state.is_empty() {
            role = st.state.clone();
            println!(
                "replica {}: {} (leader {:?}, epoch round {})",
                config.member.id, role, st.leader, st.view
            );
        }
    }
    server.stop();
    Ok(())
}
