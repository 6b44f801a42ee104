//! Participants of one domain in one process (shm fabric, control plane on
//! loopback): one publisher, three subscribers, every QoS level; then a
//! subscriber that leaves, misses samples and restarts, catching up from
//! the group's history and its own log.

use ordo_dds::{Bytes, DomainParticipant, QosLevel, ReaderQos, TopicCore};
use ordo_r2p2::disk::FsDisk;
use ordo_runtime::{OrdoConfig, Secret};
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

fn free_port() -> u16 {
    ordo_runtime::unused_local_port().expect("a free port")
}

const TOPICS: [(&str, QosLevel); 4] = [
    ("u", QosLevel::Unordered),
    ("a", QosLevel::AtomicMulticast),
    ("v", QosLevel::VolatileStorage),
    ("l", QosLevel::LoggedStorage),
];

struct Domain {
    dir: PathBuf,
    cluster: String,
    control: Vec<u16>,
}

impl Domain {
    fn new(name: &str) -> Domain {
        let dir = std::env::temp_dir().join(format!("ordo-dds-{name}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        Secret::generate_file(&dir.join("cluster.secret")).unwrap();
        Domain {
            dir,
            cluster: format!("dds-{name}-{}", std::process::id()),
            control: (0..4).map(|_| free_port()).collect(),
        }
    }

    fn config(&self, id: u32, join: bool) -> OrdoConfig {
        self.config_with(id, join, "")
    }

    fn config_with(&self, id: u32, join: bool, extra: &str) -> OrdoConfig {
        let control: Vec<String> = self
            .control
            .iter()
            .enumerate()
            .map(|(i, p)| format!("{{ id = {i}, addr = \"127.0.0.1:{p}\" }}"))
            .collect();
        let topics: String = TOPICS
            .iter()
            .map(|(n, q)| {
                format!(
                    "[[dds.topics]]\nname = \"{n}\"\nqos = \"{}\"\npublishers = [0]\nsubscribers = [1, 2, 3]\nmax_sample = 1024\nwindow = 16\nhistory = 100\ntype_name = \"bytes\"\n",
                    q.name()
                )
            })
            .collect();
        let text = format!(
            "[member]\nid = {id}\n[group]\nmembers = [0, 1, 2, 3]\n[fabric.shm]\ncluster = \"{}\"\n[security]\nsecret_file = \"{}\"\n[node]\ncontrol = [{}]\ntick_ms = 25\njoin = {join}\n[dds]\ndata_dir = \"{}\"\n{topics}",
            self.cluster,
            self.dir.join("cluster.secret").display(),
            control.join(", "),
            self.dir.join("data").display(),
        ) + extra;
        OrdoConfig::load_str(&text, Path::new("dds.toml"), std::iter::empty::<(String, String)>(), &[])
            .unwrap()
    }

    fn start_all(&self) -> Vec<DomainParticipant> {
        self.start_all_with("")
    }

    fn start_all_with(&self, extra: &str) -> Vec<DomainParticipant> {
        std::thread::scope(|s| {
            let hs: Vec<_> = (0..4u32)
                .map(|id| {
                    let c = self.config_with(id, false, extra);
                    s.spawn(move || DomainParticipant::new(&c).unwrap())
                })
                .collect();
            hs.into_iter().map(|h| h.join().unwrap()).collect()
        })
    }
}

impl Drop for Domain {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.dir);
        ordo_runtime::node::remove_view_files(Path::new("/dev/shm"), &self.cluster);
    }
}

/// Sample `i` of topic `t`: 100..=1000 bytes that are a function of both.
fn data(t: usize, i: u64) -> Vec<u8> {
    let len = 100 + (i as usize * 37) % 900;
    (0..len).map(|k| (k as u64 ^ i.wrapping_mul(31) ^ t as u64) as u8).collect()
}

fn publish(p: &DomainParticipant, range: std::ops::Range<u64>) {
    let writers: Vec<_> = TOPICS
        .iter()
        .map(|(n, _)| {
            let mut w = p.create_writer(&p.topic::<Bytes>(n).unwrap()).unwrap();
            w.set_max_blocking_time(Duration::from_secs(20));
            w
        })
        .collect();
    for i in range {
        for (t, w) in writers.iter().enumerate() {
            let d = data(t, i);
            let seq = w.write_with(&[], d.len(), |b| b.copy_from_slice(&d)).unwrap();
            assert_eq!(seq, i, "writer sequence numbers follow the writes");
        }
    }
}

/// (sequence, position, data) of samples, in take order.
type Got = Vec<(u64, u64, Vec<u8>)>;

/// (sequence, position, data) of `n` samples from `reader`, in take order.
fn drain(reader: &ordo_dds::DataReader<Bytes>, n: usize) -> Got {
    let deadline = Instant::now() + Duration::from_secs(30);
    let mut got = Vec::new();
    while got.len() < n {
        assert!(Instant::now() < deadline, "{} of {n} samples", got.len());
        reader.wait(Duration::from_millis(100));
        for s in reader.take(usize::MAX) {
            got.push((s.info.sequence, s.info.position, s.data.0));
        }
    }
    got
}

#[test]
fn one_publisher_three_subscribers_every_qos_level() {
    let d = Domain::new("all");
    let ps = d.start_all();
    let readers: Vec<Vec<_>> = ps[1..]
        .iter()
        .map(|p| {
            TOPICS
                .iter()
                .map(|(n, _)| {
                    p.create_reader(&p.topic::<Bytes>(n).unwrap(), ReaderQos::keep_all(10_000)).unwrap()
                })
                .collect()
        })
        .collect();
    // An unknown topic or a wrong type is refused. (A subscriber that
    // creates a writer becomes a publisher: `topics_declared_at_run_time`.)
    assert!(ps[0].topic::<Bytes>("nope").is_err());
    assert!(ps[0].topic::<String>("a").is_err());
    const N: u64 = 400;
    publish(&ps[0], 1..N + 1);
    let mut per_topic: Vec<Vec<Got>> = vec![Vec::new(); 4];
    for rs in &readers {
        for (t, r) in rs.iter().enumerate() {
            let got = drain(r, N as usize);
            // Every sample once, the publisher's order, the bytes it wrote.
            assert_eq!(got.iter().map(|g| g.0).collect::<Vec<_>>(), (1..=N).collect::<Vec<_>>(), "topic {t}");
            for (seq, _, bytes) in &got {
                assert_eq!(bytes, &data(t, *seq));
            }
            if TOPICS[t].1.ordered() {
                assert_eq!(
                    got.iter().map(|g| g.1).collect::<Vec<_>>(),
                    (1..=N).collect::<Vec<_>>(),
                    "positions"
                );
            }
            per_topic[t].push(got);
        }
    }
    for (t, subs) in per_topic.iter().enumerate() {
        assert!(subs.windows(2).all(|w| w[0] == w[1]), "topic {t}: subscribers agree");
    }
    // The logged topic's log at each subscriber holds every sample.
    for p in &ps[1..] {
        let l = p.topic::<Bytes>("l").unwrap();
        let st = p.topic_stats(&l);
        assert_eq!((st.delivered, st.logged), (N, N));
        assert!(p.fault(&l).is_none());
    }
    for p in ps {
        p.stop();
    }
}

#[test]
fn a_subscriber_that_restarts_catches_up_from_the_history_and_its_log() {
    let d = Domain::new("rejoin");
    let mut ps = d.start_all();
    const N1: u64 = 120;
    const N2: u64 = 60;
    const N3: u64 = 30;
    publish(&ps[0], 1..N1 + 1);
    // Member 3 got everything so far, then leaves.
    let r3 = ps[3].create_reader(&ps[3].topic::<Bytes>("l").unwrap(), ReaderQos::keep_all(10_000)).unwrap();
    assert_eq!(drain(&r3, 100).len(), 100, "history 100: a late reader starts with the last 100");
    let deadline = Instant::now() + Duration::from_secs(20);
    while ps[3].topic_stats(&ps[3].topic::<Bytes>("l").unwrap()).logged < N1 {
        assert!(Instant::now() < deadline);
        std::thread::sleep(Duration::from_millis(5));
    }
    let gone = ps.pop().unwrap();
    gone.leave();
    assert!(gone.wait(Duration::from_secs(10)).is_some());
    gone.stop();
    // The others go on without it.
    publish(&ps[0], N1 + 1..N1 + N2 + 1);
    // It restarts: replays its log, joins, restores the group's history.
    let back = DomainParticipant::new(&d.config(3, true)).unwrap();
    assert!(back.wait_running(Duration::from_secs(20)), "{:?}", back.status());
    let total = N1 + N2;
    for (t, name) in [(2, "v"), (3, "l")] {
        let r = back.create_reader(&back.topic::<Bytes>(name).unwrap(), ReaderQos::keep_all(10_000)).unwrap();
        let got = drain(&r, 100);
        assert_eq!(
            got.iter().map(|g| g.1).collect::<Vec<_>>(),
            (total - 99..=total).collect::<Vec<_>>(),
            "{name}"
        );
        for (seq, pos, bytes) in &got {
            assert_eq!(seq, pos, "one publisher: its sequence is the position");
            assert_eq!(bytes, &data(t, *seq));
        }
    }
    // And live samples after that, once each.
    let live = back.create_reader(&back.topic::<Bytes>("a").unwrap(), ReaderQos::keep_all(10_000)).unwrap();
    publish(&ps[0], total + 1..total + N3 + 1);
    let got = drain(&live, N3 as usize);
    assert_eq!(got.iter().map(|g| g.1).collect::<Vec<_>>(), (total + 1..=total + N3).collect::<Vec<_>>());
    let l = back.topic::<Bytes>("l").unwrap();
    let deadline = Instant::now() + Duration::from_secs(20);
    while back.topic_stats(&l).delivered < total + N3 {
        assert!(Instant::now() < deadline);
        std::thread::sleep(Duration::from_millis(5));
    }
    back.stop();
    // Its log on disk: every sample it saw, as sent.
    let c = d.config(3, true);
    let dir = ordo_dds::log_dir(&c, 3, "l");
    let topic = c.dds.topics[3].clone();
    let reopened = TopicCore::with_log(topic, FsDisk::open(&dir).unwrap(), true).unwrap();
    assert_eq!(reopened.delivered(), total + N3);
    // Segments: the first (a marker, samples 1..=N1), the rejoin's (a
    // marker, the restored history of 100, then N3 live samples).
    assert_eq!(reopened.log().unwrap().last_index(), 1 + N1 + 1 + 100 + N3);
    assert_eq!(
        reopened.history().map(|s| s.position).collect::<Vec<_>>(),
        (total + N3 - 99..=total + N3).collect::<Vec<_>>()
    );
    for s in reopened.history() {
        assert_eq!(s.data(), &data(3, s.position)[..]);
    }
    for p in ps {
        p.stop();
    }
}

#[derive(Clone, Copy, Debug, PartialEq, bytemuck::Pod, bytemuck::Zeroable)]
#[repr(C)]
struct Reading {
    sensor: u32,
    flags: u32,
    value: f64,
}

#[derive(serde::Serialize, serde::Deserialize, Debug, PartialEq, Clone)]
struct Alarm {
    room: String,
    level: u32,
}

impl ordo_dds::JsonKey for Alarm {
    fn key(&self) -> Vec<u8> {
        self.room.as_bytes().to_vec()
    }
}

#[test]
fn loans_listeners_waitsets_and_keyed_instances() {
    use ordo_dds::{KeyedJson, Pod, WaitSet};
    use std::sync::Arc;
    use std::sync::atomic::{AtomicU64, Ordering};
    let d = Domain::new("api");
    let extra = "[[dds.topics]]\nname = \"pod\"\npublishers = [0]\nsubscribers = [1, 2, 3]\nmax_sample = 64\n\
                 [[dds.topics]]\nname = \"alarms\"\nqos = \"volatile-storage\"\npublishers = [0]\nsubscribers = [1, 2, 3]\nmax_sample = 256\nhistory = 50\n";
    let ps = d.start_all_with(extra);
    let pod = ps[0].topic::<Pod<Reading>>("pod").unwrap();
    let alarms = ps[0].topic::<KeyedJson<Alarm>>("alarms").unwrap();
    // Member 1: a listener on the pod topic, a waitset over both readers.
    let r_pod =
        ps[1].create_reader(&ps[1].topic::<Pod<Reading>>("pod").unwrap(), ReaderQos::keep_all(1000)).unwrap();
    let r_alarm = ps[1]
        .create_reader(&ps[1].topic::<KeyedJson<Alarm>>("alarms").unwrap(), ReaderQos::keep_last(1))
        .unwrap();
    let heard = Arc::new(AtomicU64::new(0));
    let h = heard.clone();
    r_pod.set_listener(Some(Box::new(move || {
        h.fetch_add(1, Ordering::Relaxed);
    })));
    let mut ws = WaitSet::new();
    let (i_pod, i_alarm) = (ws.attach(&r_pod), ws.attach(&r_alarm));
    assert!(ws.wait(Duration::from_millis(20)).is_empty(), "nothing yet");
    // The loan: the sample is built in the ring slot.
    let w = ps[0].create_writer(&pod).unwrap();
    for k in 0..100u32 {
        w.loan(|r| *r = Reading { sensor: k, flags: 0, value: f64::from(k) / 2.0 }).unwrap();
    }
    let deadline = Instant::now() + Duration::from_secs(10);
    let mut readings = Vec::new();
    while readings.len() < 100 {
        assert!(Instant::now() < deadline);
        let ready = ws.wait(Duration::from_millis(100));
        if ready.contains(&i_pod) {
            r_pod.take_in_place(usize::MAX, |_, r| readings.push(*r));
        }
    }
    assert_eq!(readings.iter().map(|r| r.sensor).collect::<Vec<_>>(), (0..100).collect::<Vec<_>>());
    assert_eq!(readings[7].value, 3.5);
    // The listener runs on the member's thread after the samples are
    // queued: a reader may take them before it has run.
    let deadline = Instant::now() + Duration::from_secs(5);
    while heard.load(Ordering::Relaxed) == 0 {
        assert!(Instant::now() < deadline, "the listener ran");
        std::thread::sleep(Duration::from_millis(1));
    }
    // Keyed instances: KEEP_LAST(1) keeps the newest alarm per room.
    let wa = ps[0].create_writer(&alarms).unwrap();
    for (room, level) in [("a", 1), ("b", 1), ("a", 2), ("a", 3), ("b", 4)] {
        wa.write(&KeyedJson(Alarm { room: room.into(), level })).unwrap();
    }
    let deadline = Instant::now() + Duration::from_secs(10);
    while ps[1].topic_stats(&ps[1].topic::<KeyedJson<Alarm>>("alarms").unwrap()).delivered < 5 {
        assert!(Instant::now() < deadline);
        std::thread::sleep(Duration::from_millis(5));
    }
    assert!(ws.wait(Duration::from_secs(1)).contains(&i_alarm));
    let mut got: Vec<(String, u32)> =
        r_alarm.take(10).into_iter().map(|s| (s.data.0.room, s.data.0.level)).collect();
    got.sort();
    assert_eq!(got, vec![("a".into(), 3), ("b".into(), 4)]);
    // A late reader of the stored topic gets its history (TRANSIENT).
    let late = ps[2]
        .create_reader(&ps[2].topic::<KeyedJson<Alarm>>("alarms").unwrap(), ReaderQos::keep_all(100))
        .unwrap();
    let all = late.read(100);
    assert_eq!(all.len(), 5);
    assert!(all.iter().all(|s| !s.info.was_read));
    assert!(late.read(100).iter().all(|s| s.info.was_read), "read marks, take removes");
    assert_eq!(all[2].info.key, b"a");
    for p in ps {
        p.stop();
    }
}

#[test]
fn bad_domains_are_refused_with_a_clear_error() {
    let d = Domain::new("bad");
    let base = d.config(0, false);
    let refused = |c: OrdoConfig| match DomainParticipant::new(&c) {
        Err(ordo_dds::DdsError::Config(why)) => why,
        Err(e) => panic!("{e}"),
        Ok(_) => panic!("accepted"),
    };
    let mut c = base.clone();
    c.dds.topics[1].name = "u".into();
    assert!(refused(c).contains("declared twice"));
    let mut c = base.clone();
    c.dds.topics[0].subscribers.push(9);
    assert!(refused(c).contains("not in group.members"));
    let mut c = base.clone();
    c.dds.topics[0].publishers.clear();
    assert!(refused(c).contains("no publishers"));
    let mut c = base.clone();
    c.dds.topics[2].history = 0;
    assert!(refused(c).contains("history is 0"));
    let mut c = base.clone();
    c.dds.relay = vec![ordo_runtime::TcpPeer { id: 0, addr: "127.0.0.1:1".into() }];
    assert!(refused(c).contains("client_secret"));
    let mut c = base.clone();
    c.vsync.subgroups = ordo_dds::vsync_layout(&base);
    assert!(refused(c).contains("vsync.subgroups"));
    let mut c = base;
    c.dds.topics[3].window = 0;
    assert!(refused(c).contains("window"));
}

fn spec(name: &str, qos: QosLevel) -> ordo_dds::TopicConfig {
    ordo_dds::TopicConfig {
        name: name.into(),
        qos,
        publishers: vec![],
        subscribers: vec![],
        max_sample: 1024,
        window: 16,
        history: 100,
        type_name: "bytes".into(),
    }
}

fn write_n(w: &ordo_dds::DataWriter<Bytes>, t: usize, range: std::ops::Range<u64>) {
    for i in range {
        let d = data(t, i);
        assert_eq!(w.write_with(&[], d.len(), |b| b.copy_from_slice(&d)).unwrap(), i);
    }
}

/// Topics that no configuration names: participants create them (DCPS
/// `create_topic`) and join them by creating writers and readers — each a
/// view change whose decision carries the grown catalogue (spindle §IV-F:
/// the topic's subgroup holds its publishers and subscribers). A reader
/// that joins a volatile topic late starts with its history (state
/// transfer); a logged topic gets a log at every member that joins it.
#[test]
fn topics_declared_at_run_time() {
    let d = Domain::new("runtime");
    let ps: Vec<DomainParticipant> = std::thread::scope(|s| {
        let hs: Vec<_> = (0..4u32)
            .map(|id| {
                let mut c = d.config(id, false);
                c.dds.topics.clear();
                s.spawn(move || DomainParticipant::new(&c).unwrap())
            })
            .collect();
        hs.into_iter().map(|h| h.join().unwrap()).collect()
    });
    for p in &ps {
        assert!(p.wait_running(Duration::from_secs(20)));
        assert!(p.topic_names().is_empty());
        assert!(matches!(p.topic::<Bytes>("rt"), Err(ordo_dds::DdsError::UnknownTopic(_))));
    }
    let view0 = ps[0].status().view;
    let rt = ps[0].create_topic::<Bytes>(spec("rt", QosLevel::VolatileStorage)).unwrap();
    let mut w = ps[0].create_writer(&rt).unwrap();
    w.set_max_blocking_time(Duration::from_secs(20));
    let deadline = Instant::now() + Duration::from_secs(5);
    while ps[0].status().view == view0 {
        assert!(Instant::now() < deadline, "the topic was created by a view change");
        std::thread::sleep(Duration::from_millis(10));
    }
    // Two subscribers join it (a view change each) before anything is
    // written; every member learns the topic.
    // (Another member knows the topic once it installed the view that made
    // it; `create_topic` with the same definition needs no wait.)
    let r1 = ps[1]
        .create_reader(
            &ps[1].create_topic::<Bytes>(spec("rt", QosLevel::VolatileStorage)).unwrap(),
            ReaderQos::keep_all(10_000),
        )
        .unwrap();
    let r2 = ps[2]
        .create_reader(
            &ps[2].create_topic::<Bytes>(spec("rt", QosLevel::VolatileStorage)).unwrap(),
            ReaderQos::keep_all(10_000),
        )
        .unwrap();
    // Another definition of the same name is refused, and a writer of a
    // topic is not a reader's business: member 1 did not become a
    // publisher.
    match ps[3].create_topic::<Bytes>(spec("rt", QosLevel::LoggedStorage)) {
        Err(ordo_dds::DdsError::Declare { why, .. }) => assert!(why.contains("otherwise"), "{why}"),
        Err(e) => panic!("{e}"),
        Ok(_) => panic!("a second definition was accepted"),
    }
    write_n(&w, 0, 1..201);

    let a = drain(&r1, 200);
    let b = drain(&r2, 200);
    assert_eq!(a, b, "one order");
    assert_eq!(a.iter().map(|x| x.1).collect::<Vec<_>>(), (1..=200).collect::<Vec<u64>>());
    // A late subscriber: it starts with the last `history` samples (the
    // state its join fetched), then gets the new ones.
    let r3 = ps[3].create_reader(&ps[3].topic::<Bytes>("rt").unwrap(), ReaderQos::keep_all(10_000)).unwrap();
    write_n(&w, 0, 201..301);
    let c = drain(&r3, 200);
    assert_eq!(c.iter().map(|x| x.1).collect::<Vec<_>>(), (101..=300).collect::<Vec<u64>>());
    let a2 = drain(&r1, 100);
    assert_eq!(&c[100..], &a2[..], "the late subscriber's new samples are the others'");
    assert_eq!(c[..100], a[100..200], "its history is theirs");
    // A subscriber that creates a writer becomes one of the topic's
    // publishers (a view change); its samples join the one order.
    let mut w1 = ps[1].create_writer(&ps[1].topic::<Bytes>("rt").unwrap()).unwrap();
    w1.set_max_blocking_time(Duration::from_secs(20));
    write_n(&w1, 5, 1..11);
    let tail = drain(&r2, 110);
    assert_eq!(&tail[..100], &a2[..]);
    assert_eq!(
        tail[100..].iter().map(|x| (x.0, x.1)).collect::<Vec<_>>(),
        (1..=10).map(|i| (i, 300 + i)).collect::<Vec<_>>()
    );
    assert!(tail[100..].iter().enumerate().all(|(i, x)| x.2 == data(5, i as u64 + 1)));
    // Two threads of one participant joining one new topic at once (a
    // writer and a reader): both are answered.
    let both = ps[3].create_topic::<Bytes>(spec("both", QosLevel::AtomicMulticast)).unwrap();
    std::thread::scope(|s| {
        let w = s.spawn(|| ps[3].create_writer(&both).map(|_| ()));
        let r = s.spawn(|| ps[3].create_reader(&both, ReaderQos::default()).map(|_| ()));
        w.join().unwrap().unwrap();
        r.join().unwrap().unwrap();
    });
    // A logged topic created at run time: member 1 publishes, member 2
    // subscribes; member 2's log holds the samples.
    let lt = ps[1].create_topic::<Bytes>(spec("lt", QosLevel::LoggedStorage)).unwrap();
    let mut lw = ps[1].create_writer(&lt).unwrap();
    lw.set_max_blocking_time(Duration::from_secs(20));
    let lr = ps[2]
        .create_reader(
            &ps[2].create_topic::<Bytes>(spec("lt", QosLevel::LoggedStorage)).unwrap(),
            ReaderQos::keep_all(10_000),
        )
        .unwrap();
    write_n(&lw, 1, 1..51);
    assert_eq!(drain(&lr, 50).len(), 50);
    let lt2 = ps[2].topic::<Bytes>("lt").unwrap();
    assert_eq!(ps[2].fault(&lt2), None);
    assert_eq!(ps[2].topic_stats(&lt2).logged, 50);
    assert!(ordo_dds::log_dir(ps[2].config(), 2, "lt").is_dir());
    let deadline = Instant::now() + Duration::from_secs(10);
    for p in &ps {
        while p.topic_names() != ["rt", "both", "lt"] {
            assert!(Instant::now() < deadline, "m{}: {:?}", p.member(), p.topic_names());
            std::thread::sleep(Duration::from_millis(5));
        }
    }
    for p in ps {
        p.stop();
    }
}
