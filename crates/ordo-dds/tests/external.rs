//! External clients through members' relays (spindle §II-A): the client
//! secret, errors that change nothing, publish and subscribe, a relay that
//! dies under a subscriber, and a subscriber too slow for its relay.

use ordo_dds::client::{ClientError, ExternalParticipant};
use ordo_dds::wire::{ErrorCode, Frame, read_frame, write_frame};
use ordo_dds::{Bytes, DomainParticipant, ReaderQos};
use ordo_runtime::{OrdoConfig, Secret};
use std::net::TcpStream;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

fn free_port() -> u16 {
    ordo_runtime::unused_local_port().expect("a free port")
}

struct Domain {
    dir: PathBuf,
    cluster: String,
    control: Vec<u16>,
    relay: Vec<u16>,
    queue: usize,
}

impl Domain {
    fn new(name: &str, queue: usize) -> Domain {
        let dir = std::env::temp_dir().join(format!("ordo-dds-ext-{name}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        Secret::generate_file(&dir.join("cluster.secret")).unwrap();
        Secret::generate_file(&dir.join("client.secret")).unwrap();
        Domain {
            dir,
            cluster: format!("ddsx-{name}-{}", std::process::id()),
            control: (0..3).map(|_| free_port()).collect(),
            relay: (0..3).map(|_| free_port()).collect(),
            queue,
        }
    }

    fn relays(&self) -> Vec<String> {
        self.relay.iter().map(|p| format!("127.0.0.1:{p}")).collect()
    }

    fn config(&self, id: u32, join: bool) -> OrdoConfig {
        let list = |ports: &[u16]| -> String {
            ports
                .iter()
                .enumerate()
                .map(|(i, p)| format!("{{ id = {i}, addr = \"127.0.0.1:{p}\" }}"))
                .collect::<Vec<_>>()
                .join(", ")
        };
        let text = format!(
            r#"[member]
id = {id}
[group]
members = [0, 1, 2]
[fabric.shm]
cluster = "{}"
[security]
secret_file = "{}"
client_secret_file = "{}"
[node]
control = [{}]
tick_ms = 25
join = {join}
[dds]
data_dir = "{}"
relay = [{}]
max_relay_queue = {}
[[dds.topics]]
name = "v"
qos = "volatile-storage"
publishers = [0, 1]
subscribers = [0, 1, 2]
max_sample = 10240
history = {}
type_name = "bytes"
[[dds.topics]]
name = "only0"
qos = "atomic-multicast"
publishers = [0]
subscribers = [1, 2]
max_sample = 64
"#,
            self.cluster,
            self.dir.join("cluster.secret").display(),
            self.dir.join("client.secret").display(),
            list(&self.control),
            self.dir.join("data").display(),
            list(&self.relay),
            self.queue,
            self.queue.min(10_000),
        );
        OrdoConfig::load_str(&text, Path::new("dds.toml"), std::iter::empty::<(String, String)>(), &[])
            .unwrap()
    }

    fn start_all(&self) -> Vec<DomainParticipant> {
        std::thread::scope(|s| {
            let hs: Vec<_> = (0..3u32)
                .map(|id| {
                    let c = self.config(id, false);
                    s.spawn(move || DomainParticipant::new(&c).unwrap())
                })
                .collect();
            hs.into_iter().map(|h| h.join().unwrap()).collect()
        })
    }

    /// A hand-made client of member `m`'s relay, past the handshake.
    fn raw_client(&self, m: usize) -> TcpStream {
        let mut raw = TcpStream::connect(&self.relays()[m]).unwrap();
        let key = self.client_secret().derive(ordo_dds::wire::HANDSHAKE_LABEL);
        let hello = Frame::Hello { nonce: ordo_auth::handshake::nonce() };
        write_frame(&mut raw, &hello).unwrap();
        let Ok(Ok(Frame::Welcome { member, nonce, .. })) = read_frame(&mut raw, 128) else {
            panic!("no welcome")
        };
        let h_a = Frame::Welcome { member, nonce, proof: [0; 32] }.to_bytes();
        let proof =
            ordo_auth::handshake::proof(&key, ordo_auth::handshake::Role::Dialer, &hello.to_bytes(), &h_a);
        write_frame(&mut raw, &Frame::Proof { proof }).unwrap();
        raw
    }

    fn client_secret(&self) -> Secret {
        Secret::from_file(&self.dir.join("client.secret")).unwrap()
    }
}

impl Drop for Domain {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.dir);
        ordo_runtime::node::remove_view_files(Path::new("/dev/shm"), &self.cluster);
    }
}

fn data(i: u64) -> Vec<u8> {
    (0..64 + (i % 200) as usize).map(|k| (k as u64 ^ i) as u8).collect()
}

#[test]
fn strangers_and_bad_requests_are_refused_and_change_nothing() {
    let d = Domain::new("refuse", 4096);
    let ps = d.start_all();
    // No client secret, no connection.
    let stranger = Secret::generate();
    assert!(matches!(
        ExternalParticipant::connect(&d.relays()[..1], &stranger),
        Err(ClientError::Unreachable(_))
    ));
    let c = ExternalParticipant::connect(&d.relays()[..1], &d.client_secret()).unwrap();
    assert_eq!(c.relay_member(), 0);
    let refused = |r: Result<ordo_dds::client::ExternalSubscription, ClientError>| match r {
        Err(ClientError::Refused { code, .. }) => code,
        Err(e) => panic!("{e}"),
        Ok(_) => panic!("accepted"),
    };
    assert_eq!(refused(c.subscribe("nope", "", 10)), ErrorCode::UnknownTopic);
    assert_eq!(refused(c.subscribe("v", "string", 10)), ErrorCode::TypeMismatch);
    // Member 0 is not a subscriber of "only0"? It is its publisher, so a member.
    let c2 = ExternalParticipant::connect(&d.relays()[2..], &d.client_secret()).unwrap();
    assert!(matches!(
        c2.writer("only0", ""),
        Err(ClientError::Refused { code: ErrorCode::NotAPublisher, .. })
    ));
    let w = c.writer("only0", "").unwrap();
    assert!(matches!(w.write(b"", &[0; 65]), Err(ClientError::TooLarge(..))));
    // A raw client: garbage after the handshake is answered, not applied.
    let mut raw = d.raw_client(0);
    use std::io::Write;
    raw.write_all(&[5, 0, 0, 0, 12, 9, 9, 9, 9]).unwrap(); // a PUBLISH cut short
    let Ok(Ok(Frame::Error { code, .. })) = read_frame(&mut raw, 1 << 20) else { panic!("no error") };
    assert_eq!(code, ErrorCode::Malformed);
    write_frame(&mut raw, &Frame::Publish { topic: 0, key: vec![], data: vec![1] }).unwrap();
    let Ok(Ok(Frame::Error { code, .. })) = read_frame(&mut raw, 1 << 20) else { panic!("no error") };
    assert_eq!(code, ErrorCode::NoWriter);
    // Nothing reached the topic.
    std::thread::sleep(Duration::from_millis(50));
    for p in &ps {
        assert_eq!(p.topic_stats(&p.topic::<Bytes>("v").unwrap()).delivered, 0);
    }
    drop((c, c2, raw));
    for p in ps {
        p.stop();
    }
}

#[test]
fn an_external_subscriber_survives_its_relay_and_misses_nothing() {
    let d = Domain::new("failover", 4096);
    let mut ps = d.start_all();
    // The external subscriber talks to member 1's relay, then member 2's.
    let sub = ExternalParticipant::connect(&d.relays()[1..], &d.client_secret()).unwrap();
    assert_eq!(sub.relay_member(), 1);
    let s = sub.subscribe("v", "bytes", 100_000).unwrap();
    // An external publisher through member 0's relay.
    let pubc = ExternalParticipant::connect(&d.relays()[..1], &d.client_secret()).unwrap();
    let w = pubc.writer("v", "bytes").unwrap();
    const N: u64 = 600;
    let mut got = Vec::new();
    let take = |got: &mut Vec<ordo_dds::client::ExternalSample>, until: usize| {
        let deadline = Instant::now() + Duration::from_secs(30);
        while got.len() < until {
            assert!(Instant::now() < deadline, "{} of {until}", got.len());
            s.wait(Duration::from_millis(50));
            got.extend(s.take(usize::MAX));
        }
    };
    for i in 1..=N / 2 {
        w.write(b"", &data(i)).unwrap();
    }
    w.flush().unwrap();
    take(&mut got, (N / 2) as usize);
    // Member 1 (the subscriber's relay) leaves and stops.
    let m1 = ps.remove(1);
    m1.leave();
    m1.stop();
    for i in N / 2 + 1..=N {
        w.write(b"", &data(i)).unwrap();
    }
    w.flush().unwrap();
    take(&mut got, N as usize);
    assert!(sub.reconnects() >= 1 && sub.relay_member() == 2);
    // Every sample once, in the topic's order, with the bytes written.
    assert_eq!(got.iter().map(|x| x.position).collect::<Vec<_>>(), (1..=N).collect::<Vec<_>>());
    for x in &got {
        assert_eq!(x.data, data(x.position), "one publisher: position = its order");
        assert_eq!(x.source, 0);
    }
    // Members' own readers agree.
    let r = ps[1].create_reader(&ps[1].topic::<Bytes>("v").unwrap(), ReaderQos::keep_all(10_000)).unwrap();
    assert_eq!(r.take(usize::MAX).len(), N as usize);
    drop((sub, pubc));
    for p in ps {
        p.stop();
    }
}

#[test]
fn a_subscriber_too_slow_for_its_relay_is_dropped_and_the_group_goes_on() {
    let d = Domain::new("slow", 16);
    let ps = d.start_all();
    // A raw subscriber that never reads.
    let mut raw = d.raw_client(1);
    write_frame(
        &mut raw,
        &Frame::Subscribe { req: 1, after: 0, topic: "v".into(), type_name: String::new() },
    )
    .unwrap();
    // Subscribed (the answer comes before any sample); from here it never reads.
    let Ok(Ok(Frame::Ok { req: 1, .. })) = read_frame(&mut raw, 1 << 20) else { panic!("no OK") };
    // The group publishes far more than socket buffers and the relay's
    // 16-frame queue hold.
    let r2 = ps[2].create_reader(&ps[2].topic::<Bytes>("v").unwrap(), ReaderQos::keep_all(100_000)).unwrap();
    let mut w = ps[0].create_writer(&ps[0].topic::<Bytes>("v").unwrap()).unwrap();
    w.set_max_blocking_time(Duration::from_secs(20));
    const N: u64 = 3000;
    for i in 1..=N {
        w.write_with(b"", 10_000, |b| b.fill(i as u8)).unwrap();
    }
    let deadline = Instant::now() + Duration::from_secs(30);
    while r2.len() < N as usize {
        assert!(Instant::now() < deadline, "the group stalled at {}", r2.len());
        std::thread::sleep(Duration::from_millis(10));
    }
    let deadline = Instant::now() + Duration::from_secs(10);
    while ps[1].relay_counters().unwrap().1 == 0 {
        assert!(Instant::now() < deadline, "the slow subscriber was not dropped");
        std::thread::sleep(Duration::from_millis(10));
    }
    // What it gets: some samples (what its socket buffered), at most a
    // DROPPED (if its socket still took one), then the end — a bounded read.
    let mut frames = 0;
    while let Ok(Ok(f)) = read_frame(&mut raw, 1 << 20) {
        assert!(matches!(f, Frame::Ok { .. } | Frame::Sample { .. } | Frame::Dropped { .. }), "{f:?}");
        frames += 1;
    }
    assert!(frames < N as usize, "the relay held no more than socket buffers and its queue");
    assert_eq!(ps[1].relay_counters().unwrap().0, 0, "the connection is gone");
    for p in ps {
        p.stop();
    }
}
