//! Seeded simulation of vsync view changes (see `src/vsync_views.rs` for
//! what is drawn and checked): fresh seeds every run, pinned seeds,
//! determinism, coverage of the interesting paths, and a bad history for
//! every checker.

use ordo_simulation::vsync_views as sim;

#[test]
fn fresh_seeds() {
    ordo_simulation::assert_fresh_seeds(sim::NAME, 500);
}

/// Prints the history of `ORDO_DEBUG_SEED` (a debugging aid, not a check).
#[test]
#[ignore]
fn print_history() {
    let seed: u64 = std::env::var("ORDO_DEBUG_SEED").map(|s| s.parse().unwrap()).unwrap_or(0);
    let params = sim::Params::draw(seed);
    println!("{params:?}");
    let h = sim::simulate(seed, &params);
    for f in &h.faults {
        println!("{:>9} FAULT {:?}", f.time_ns, f.fault);
    }
    for e in &h.entries {
        println!("{:>9} m{} {:?}", e.time_ns, e.member, e.event);
    }
    println!("{:?}", ordo_sim::check_all(&h, &sim::checkers(&params.group)));
}

/// The seeds exercise what they claim to: view changes, ragged edges,
/// resends, minorities, removals, survivors that finish.
#[test]
fn seeds_cover_the_interesting_paths() {
    let (mut views, mut ragged, mut resent, mut minority, mut removed, mut survived, mut multi) =
        (0, 0, 0, 0, 0, 0, 0);
    let seeds = 300;
    for seed in 5000..5000 + seeds {
        let params = sim::Params::draw(seed);
        let h = sim::simulate(seed, &params);
        ordo_sim::check_all(&h, &sim::checkers(&params.group)).unwrap_or_else(|v| panic!("seed {seed}: {v}"));
        let mut top = 0;
        let mut finished = false;
        for e in &h.entries {
            match &e.event {
                sim::ViewsEvent::Installed { view, ragged: r, resent: s, .. } => {
                    top = top.max(*view);
                    ragged += usize::from(*r > 0);
                    resent += usize::from(*s > 0);
                }
                sim::ViewsEvent::Minority { .. } => minority += 1,
                sim::ViewsEvent::Removed { .. } => removed += 1,
                sim::ViewsEvent::Finished => finished = true,
                _ => {}
            }
        }
        views += u32::from(top >= 1);
        multi += u32::from(top >= 2);
        survived += u32::from(top >= 1 && finished);
    }
    println!(
        "{seeds} seeds: {views} with a view change, {multi} with two or more, {survived} finished after one; \
         installs with a ragged edge {ragged}, with resends {resent}; minority stops {minority}, removals {removed}"
    );
    assert!(views >= 60, "view changes happen ({views})");
    assert!(multi >= 10, "successive view changes happen ({multi})");
    assert!(survived >= 50, "survivors finish after a view change ({survived})");
    assert!(ragged >= 30 && resent >= 10, "ragged edges ({ragged}) and resends ({resent}) happen");
    assert!(minority >= 10 && removed >= 5, "minorities ({minority}) and removals ({removed}) happen");
}
