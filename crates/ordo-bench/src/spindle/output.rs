//! The Spindle benchmark's outputs: CSV files, PNG plots (one per figure,
//! spindle §IV's panels), and the tables printed on screen.

#![allow(unused_imports)]

use super::*;
use crate::demo::monotonic_ns;
use crate::experiment::write;
use crate::machine::MachineInfo;
use crate::plot::{self, Panel, Series};
use hdrhistogram::Histogram;
use ordo_fabric::MemberId;
use ordo_fabric_shm::{ShmFabric, ShmOptions};
use ordo_runtime::{
    Agent, Delivery, IdleStrategy, Runner, RunnerOptions, SubgroupHandle, ThreadingMode, VsyncMember,
};
use ordo_vsync::{
    BatchHistogram, DeliveryMode, GroupConfig, SendError, SubgroupConfig, SubgroupStats, Switches,
};
use serde::Serialize;
use std::collections::{BTreeMap, HashMap};
use std::fmt::Write as _;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

pub(super) const CSV_HEADER: &str = "figure,variant,members,senders,pattern,size_bytes,subgroups,active_subgroups,window,\
delayed_senders,delay,memcpy,throughput_bytes_per_s,messages_per_s,latency_ns_p50,latency_ns_p99,\
send_batch_mean,receive_batch_mean,delivery_batch_mean,nulls_sent,window_s,cpu_cores,runqueue_wait_cores,attempts,contended";

pub(super) fn csv_field(s: &str) -> String {
    crate::experiment::Csv::field(s)
}

/// The rows as CSV text (header included).
pub fn rows_csv(rows: &[Row]) -> String {
    let opt = |v: Option<u64>| v.map(|v| v.to_string()).unwrap_or_default();
    let mut out = String::from(CSV_HEADER);
    out.push('\n');
    for r in rows {
        let _ = writeln!(
            out,
            "{},{},{},{},{},{},{},{},{},{},{},{},{:.1},{:.1},{},{},{:.3},{:.3},{:.3},{},{:.4},{:.2},{:.3},{},{}",
            csv_field(&r.figure),
            csv_field(&r.variant),
            r.members,
            r.senders,
            r.pattern,
            r.size_bytes,
            r.subgroups,
            r.active_subgroups,
            r.window,
            r.delayed_senders,
            r.delay,
            r.memcpy,
            r.throughput_bytes_per_s,
            r.messages_per_s,
            opt(r.latency_ns_p50),
            opt(r.latency_ns_p99),
            r.send_batch_mean,
            r.receive_batch_mean,
            r.delivery_batch_mean,
            r.nulls_sent,
            r.window_s,
            r.cpu_cores,
            r.runqueue_wait_cores,
            r.attempts,
            r.contended,
        );
    }
    out
}

/// Fig. 7's histograms as CSV: one line per power-of-two bucket.
pub fn histogram_csv(m: &Measurement) -> String {
    let mut out = String::from("bucket,batch_size_min,batch_size_max,send,receive,delivery\n");
    let hs = [&m.send_batches, &m.receive_batches, &m.delivery_batches];
    let last = hs.iter().map(|h| h.buckets.iter().rposition(|c| *c > 0).unwrap_or(0)).max().unwrap_or(0);
    for b in 0..=last {
        let _ = writeln!(
            out,
            "{b},{},{},{},{},{}",
            1u64 << b,
            (1u64 << (b + 1)) - 1,
            hs[0].buckets[b],
            hs[1].buckets[b],
            hs[2].buckets[b]
        );
    }
    out
}

pub(super) fn write_outputs(
    dir: &Path,
    rows: &[Row],
    fig7: Option<&Measurement>,
    max: u32,
) -> Result<(), String> {
    write(&dir.join("rows.csv"), &rows_csv(rows))?;
    let mut by_figure: BTreeMap<&str, Vec<Row>> = BTreeMap::new();
    for r in rows {
        by_figure.entry(r.figure.as_str()).or_default().push(r.clone());
    }
    for (figure, rows) in &by_figure {
        write(&dir.join(format!("{figure}.csv")), &rows_csv(rows))?;
        let png = dir.join(format!("{figure}.png"));
        if *figure == "fig7" {
            if let Some(m) = fig7 {
                write(&dir.join("fig7-histogram.csv"), &histogram_csv(m))?;
                plot_fig7(&png, m, max)?;
            }
        } else {
            plot_figure(&png, figure, rows)?;
        }
    }
    Ok(())
}

/// Series of `rows` grouped by `label`, x = members, y = `value`.
pub(super) fn series_by(
    rows: &[&Row],
    label: impl Fn(&Row) -> String,
    value: impl Fn(&Row) -> Option<f64>,
    dashed: impl Fn(&Row) -> bool,
) -> Vec<Series> {
    let mut out: Vec<Series> = Vec::new();
    for r in rows {
        let l = label(r);
        let Some(y) = value(r) else { continue };
        let i = match out.iter().position(|s| s.label == l) {
            Some(i) => i,
            None => {
                out.push(Series { label: l, points: Vec::new(), dashed: dashed(r), color: None });
                out.len() - 1
            }
        };
        out[i].points.push((f64::from(r.members), y));
    }
    for s in &mut out {
        s.points.sort_by(|a, b| a.0.total_cmp(&b.0));
    }
    out
}

/// Colours each series by the first of `keys` its label contains, so that
/// the lines of one key (e.g. a sender pattern) share a colour.
pub(super) fn color_by(mut series: Vec<Series>, keys: &[&str]) -> Vec<Series> {
    for s in &mut series {
        s.color = keys.iter().position(|k| s.label.contains(k));
    }
    series
}

pub(super) fn gbs(r: &Row) -> Option<f64> {
    Some(r.throughput_bytes_per_s / 1e9)
}
pub(super) fn p50_us(r: &Row) -> Option<f64> {
    r.latency_ns_p50.map(|v| v as f64 / 1e3)
}
pub(super) fn size_name(size: usize) -> String {
    if size >= 1024 { format!("{} KiB", size / 1024) } else { format!("{size} B") }
}

pub(super) fn panel(title: String, y_label: &str, series: Vec<Series>) -> Panel {
    Panel { title, x_label: "members".into(), y_label: y_label.into(), log_y: false, series }
}

pub(super) fn plot_figure(png: &Path, figure: &str, rows: &[Row]) -> Result<(), String> {
    let all: Vec<&Row> = rows.iter().collect();
    let solid_base = |r: &Row| r.variant == "baseline";
    let label_pattern = |r: &Row| {
        let who = if r.pattern == "one" { "one sender" } else { &format!("{} senders", r.pattern) };
        format!("{who}, {}", r.variant)
    };
    let patterns = ["all", "half", "one"];
    let (title, panels, cols): (&str, Vec<Panel>, usize) = match figure {
        "fig3" | "fig4" => {
            let (y, value): (&str, fn(&Row) -> Option<f64>) = if figure == "fig3" {
                ("GB/s per member", gbs)
            } else {
                ("messages/s per member", |r| Some(r.messages_per_s))
            };
            let panels = SIZES
                .iter()
                .map(|&size| {
                    let rs: Vec<&Row> = all.iter().copied().filter(|r| r.size_bytes == size).collect();
                    panel(
                        size_name(size),
                        y,
                        color_by(series_by(&rs, label_pattern, value, solid_base), &patterns),
                    )
                })
                .collect();
            let t = if figure == "fig3" {
                "Fig. 3: throughput, single subgroup, baseline (dashed) vs optimized"
            } else {
                "Fig. 4: delivery rate, single subgroup, baseline (dashed) vs optimized"
            };
            (t, panels, 2)
        }
        "fig5" => (
            "Fig. 5: batching added stage by stage (all senders, 10 KiB)",
            vec![
                panel(
                    "throughput".into(),
                    "GB/s per member",
                    series_by(&all, |r| r.variant.clone(), gbs, |_| false),
                ),
                Panel {
                    log_y: true,
                    ..panel(
                        "latency p50".into(),
                        "µs",
                        series_by(&all, |r| r.variant.clone(), p50_us, |_| true),
                    )
                },
            ],
            2,
        ),
        "fig6" => (
            "Fig. 6: window size (all senders, 10 KiB)",
            vec![panel(
                "throughput".into(),
                "GB/s per member",
                series_by(&all, |r| r.variant.clone(), gbs, solid_base_w),
            )],
            1,
        ),
        "fig8" | "fig9" => (
            if figure == "fig8" {
                "Fig. 8: baseline, one active subgroup among k"
            } else {
                "Fig. 9: optimized, one active subgroup among k"
            },
            vec![panel(
                "throughput of the active subgroup".into(),
                "GB/s per member",
                series_by(&all, |r| format!("k = {}", r.subgroups), gbs, |_| false),
            )],
            1,
        ),
        "fig10" => {
            let panels = ["one", "half"]
                .iter()
                .map(|who| {
                    let rs: Vec<&Row> = all
                        .iter()
                        .copied()
                        .filter(|r| r.delayed_senders == 0 || r.variant.contains(&format!(" {who} delayed")))
                        .collect();
                    panel(
                        format!("{who} sender(s) delayed"),
                        "GB/s per member",
                        color_by(
                            series_by(
                                &rs,
                                |r| r.variant.replace(&format!(" {who} delayed"), ""),
                                gbs,
                                |r| r.variant.starts_with("no nulls"),
                            ),
                            &["no delay", "1us", "100us", "inf"],
                        ),
                    )
                })
                .collect();
            ("Fig. 10: delayed senders, null-sends on (solid) and off (dashed)", panels, 2)
        }
        "fig11" => (
            "Fig. 11: null-sends with continuous sending",
            vec![panel(
                "throughput".into(),
                "GB/s per member",
                color_by(series_by(&all, label_pattern, gbs, |r| r.variant == "no nulls"), &patterns),
            )],
            1,
        ),
        "fig12" => (
            "Fig. 12: posting after unlocking (single subgroup, all senders)",
            vec![panel(
                "throughput".into(),
                "GB/s per member",
                series_by(&all, |r| r.variant.clone(), gbs, solid_base),
            )],
            1,
        ),
        "fig13" => {
            let panels = ACTIVE_SUBGROUPS
                .iter()
                .map(|&k| {
                    let rs: Vec<&Row> = all.iter().copied().filter(|r| r.subgroups == k).collect();
                    panel(
                        format!("k = {k} active subgroups"),
                        "GB/s per member (all subgroups)",
                        series_by(&rs, |r| r.variant.clone(), gbs, solid_base),
                    )
                })
                .collect();
            ("Fig. 13: k active subgroups, all senders, 10 KiB", panels, 3)
        }
        "fig15" => (
            "Fig. 15: memcpy on send and delivery (dashed) vs in place, 10 KiB",
            vec![panel(
                "throughput".into(),
                "GB/s per member",
                color_by(series_by(&all, label_pattern, gbs, |r| r.memcpy), &patterns),
            )],
            1,
        ),
        "fig16" => (
            "Fig. 16: final throughput (all senders, 10 KiB)",
            vec![panel(
                "throughput".into(),
                "GB/s per member",
                series_by(&all, |r| r.variant.clone(), gbs, solid_base),
            )],
            1,
        ),
        "fig17" => (
            "Fig. 17: final latency (all senders, 10 KiB)",
            vec![
                Panel {
                    log_y: true,
                    ..panel("p50".into(), "µs", series_by(&all, |r| r.variant.clone(), p50_us, solid_base))
                },
                Panel {
                    log_y: true,
                    ..panel(
                        "p99".into(),
                        "µs",
                        series_by(
                            &all,
                            |r| r.variant.clone(),
                            |r| r.latency_ns_p99.map(|v| v as f64 / 1e3),
                            solid_base,
                        ),
                    )
                },
            ],
            2,
        ),
        _ => return Ok(()),
    };
    plot::write_png(png, title, &panels, cols)
}

pub(super) fn solid_base_w(r: &Row) -> bool {
    r.variant.starts_with("baseline")
}

pub(super) fn plot_fig7(png: &Path, m: &Measurement, max: u32) -> Result<(), String> {
    let hist = |label: &str, h: &BatchHistogram| {
        let total = h.batches.max(1) as f64;
        let last = h.buckets.iter().rposition(|c| *c > 0).unwrap_or(0);
        Series {
            label: format!("{label} (mean {:.1})", h.mean()),
            points: (0..=last).map(|b| (b as f64, h.buckets[b] as f64 / total)).collect(),
            dashed: false,
            color: None,
        }
    };
    let panels = vec![Panel {
        title: format!("optimized, {max} members, all senders, 10 KiB, window {WINDOW}"),
        x_label: "batch size bucket: log2 (bucket b holds 2^b .. 2^(b+1)-1)".into(),
        y_label: "fraction of batches".into(),
        log_y: false,
        series: vec![
            hist("send", &m.send_batches),
            hist("receive", &m.receive_batches),
            hist("delivery", &m.delivery_batches),
        ],
    }];
    plot::write_png(png, "Fig. 7: batch sizes per protocol stage", &panels, 1)
}

// ---------------------------------------------------------------------------
// Text output.

/// Prints the rows as a table, then the headline comparisons.
pub fn print_table(report: &SpindleReport) {
    println!("ordo bench spindle — {}", report.machine.summary());
    println!(
        "{} points, {:.2} s window after {:.2} s warm-up each, {:.0} s in all; files in {}",
        report.points_measured, report.duration_s, report.warmup_s, report.elapsed_s, report.out_dir
    );
    let us = |v: Option<u64>| v.map(|v| format!("{:.1}", v as f64 / 1e3)).unwrap_or_else(|| "-".into());
    let mut last_figure = String::new();
    for r in report.rows.iter().filter(|r| r.figure != "summary") {
        if r.figure != last_figure {
            println!();
            println!(
                "{:<6} {:<34} {:<4} {:>3} {:>3} {:>6} {:>5} {:>4} {:>5} {:>9} {:>11} {:>9} {:>9} {:>16} {:>7} {:>4} {:>5}",
                "figure",
                "variant",
                "pat",
                "m",
                "snd",
                "size",
                "k",
                "win",
                "delay",
                "GB/s",
                "msg/s",
                "p50 us",
                "p99 us",
                "batch s/r/d",
                "nulls",
                "cpu",
                "wait"
            );
            last_figure = r.figure.clone();
        }
        println!(
            "{:<6} {:<34} {:<4} {:>3} {:>3} {:>6} {:>5} {:>4} {:>5} {:>9.3} {:>11.0} {:>9} {:>9} {:>16} {:>7} {:>4.1} {:>6}",
            r.figure,
            r.variant,
            r.pattern,
            r.members,
            r.senders,
            r.size_bytes,
            format!("{}/{}", r.active_subgroups, r.subgroups),
            r.window,
            r.delay,
            r.throughput_bytes_per_s / 1e9,
            r.messages_per_s,
            us(r.latency_ns_p50),
            us(r.latency_ns_p99),
            format!("{:.1}/{:.1}/{:.1}", r.send_batch_mean, r.receive_batch_mean, r.delivery_batch_mean),
            r.nulls_sent,
            r.cpu_cores,
            format!("{:.2}{}", r.runqueue_wait_cores, if r.contended { "*" } else { "" })
        );
    }
    println!();
    println!(
        "cpu: cores this process used in the window; wait: cores' worth of time its threads waited for a CPU. \
         A point that got under {:.0} % of the CPU it asked for (cpu / (cpu + wait)) is measured up to \
         {MAX_ATTEMPTS} times and the least contended kept.",
        crate::noise::MIN_CORE_SHARE * 100.0
    );
    let contended = report.rows.iter().filter(|r| r.contended).count();
    if contended > 0 {
        println!("{contended} row(s) stayed contended (marked *): read them with care; they are in no ratio");
    }
    println!("{}", headline(report));
    for f in &report.failures {
        println!("FAILED {} {}: {} ({})", f.figure, f.variant, f.error, f.point);
    }
}

/// The headline comparisons as text: each side median [min–max] of its
/// uncontended interleaved samples, and the ratio's.
pub fn headline(report: &SpindleReport) -> String {
    let mut out = format!(
        "Headline comparisons (3 members, 10 KiB, delivered GB/s per member; {} interleaved rounds each, \
         median [min–max]):\n",
        report.comparison_rounds
    );
    for c in &report.comparisons {
        let _ = writeln!(out, "  {}", c.line(|v| format!("{v:.3}")));
    }
    out
}
