//! The r3p2 benchmark's outputs: CSV files (every point, the summaries),
//! the PNG plots of Figs. 5.1-5.2, and the tables printed on screen.

#![allow(unused_imports)]

use super::*;
use crate::machine::MachineInfo;
use crate::plot::{Panel, Series, write_png};
use clap::Parser;
use hdrhistogram::Histogram;
use ordo_r2p2::{CallError, Client, ClientConfig, Policy};
use serde::Serialize;
use std::collections::HashMap;
use std::io::{BufRead, BufReader};
use std::net::{SocketAddr, UdpSocket};
use std::path::{Path, PathBuf};
use std::process::{Child, ChildStdout, Command, Stdio};
use std::time::{Duration, Instant};

pub(super) fn write(path: &Path, text: &str) -> Result<(), String> {
    std::fs::write(path, text).map_err(|e| format!("{}: {e}", path.display()))
}

pub(super) fn opt(v: Option<f64>, decimals: usize) -> String {
    v.map_or(String::new(), |v| format!("{v:.decimals$}"))
}

/// A curve's points as drawn: of a rate measured twice
/// ([`super::measure_retried`]), its last attempt.
pub(super) fn last_attempts<'a>(rows: &'a [&'a Row]) -> impl Iterator<Item = &'a Row> {
    rows.iter()
        .enumerate()
        .filter(|(i, r)| !rows[i + 1..].iter().any(|later| later.offered_rps == r.offered_rps))
        .map(|(_, r)| *r)
}

pub(super) fn write_files(report: &Report, out: &Path) -> Result<(), String> {
    let mut csv = String::from(
        "figure,series,policy,members,handler_us,mode,fsync,offered_rps,arrival_rps,sent_rps,achieved_rps,requests,errors,latency_ns_p50,latency_ns_p90,latency_ns_p99,latency_ns_p999,keeps_up,refined,attempt,server_cpu_percent,busiest_server_cpu_percent,busiest_server_system_percent,client_cpu_percent,udp_rcvbuf_drops,loadavg_1m\n",
    );
    for r in &report.rows {
        csv += &format!(
            "{},{},{},{},{},{},{},{:.0},{:.0},{:.0},{:.0},{},{},{},{},{},{},{},{},{},{:.0},{:.0},{:.0},{:.0},{},{:.2}\n",
            r.figure,
            r.series,
            r.policy,
            r.members,
            r.handler_us,
            r.mode,
            r.fsync,
            r.offered_rps,
            r.arrival_rps,
            r.sent_rps,
            r.achieved_rps,
            r.requests,
            r.errors,
            r.latency_ns_p50,
            r.latency_ns_p90,
            r.latency_ns_p99,
            r.latency_ns_p999,
            r.keeps_up,
            r.refined,
            r.attempt,
            r.server_cpu_percent,
            r.busiest_server_cpu_percent,
            r.busiest_server_system_percent,
            r.client_cpu_percent,
            r.udp_rcvbuf_drops,
            r.loadavg_1m
        );
    }
    write(&out.join("r3p2.csv"), &csv)?;
    let comparisons: Vec<_> = report
        .peak_loss
        .iter()
        .chain(&report.light_overhead)
        .chain(&report.calls)
        .chain(&report.leader_cost)
        .cloned()
        .collect();
    if !comparisons.is_empty() {
        write(&out.join("comparisons.csv"), &crate::noise::comparisons_csv(&comparisons))?;
    }
    let mut s = String::from(
        "figure,series,policy,members,handler_us,mode,fsync,peak_rps,max_sustained_rps,slo_us,at_slo_rps,light_latency_ns_p50,light_latency_ns_p99\n",
    );
    for c in &report.configs {
        for (slo, at) in &c.at_slo_rps {
            s += &format!(
                "{},{},{},{},{},{},{},{},{},{},{},{},{}\n",
                c.figure,
                c.series,
                c.config.policy,
                c.config.members,
                c.config.handler_us,
                c.config.mode,
                c.config.fsync,
                opt(c.peak_rps, 0),
                opt(c.max_sustained_rps, 0),
                slo,
                opt(*at, 0),
                c.light_latency_ns_p50.map_or(String::new(), |v| v.to_string()),
                c.light_latency_ns_p99.map_or(String::new(), |v| v.to_string()),
            );
        }
    }
    write(&out.join("summary.csv"), &s)?;
    write(&out.join("r3p2.json"), &serde_json::to_string_pretty(report).map_err(|e| e.to_string())?)?;
    let series_of = |figure: &str, pick: &dyn Fn(&Row) -> bool| {
        let mut labels: Vec<(String, u64)> = Vec::new();
        for r in report.rows.iter().filter(|r| r.figure == figure && pick(r)) {
            if !labels.contains(&(r.series.clone(), r.handler_us)) {
                labels.push((r.series.clone(), r.handler_us));
            }
        }
        labels
            .into_iter()
            .map(|(label, handler)| {
                let rows: Vec<&Row> = report
                    .rows
                    .iter()
                    .filter(|r| r.figure == figure && r.series == label && r.handler_us == handler)
                    .collect();
                let points = last_attempts(&rows)
                    .map(|r| (r.achieved_rps / 1e3, r.latency_ns_p99 as f64 / 1e3))
                    .collect();
                let color = if label.starts_with("unrepl") {
                    0
                } else if label.contains("fsync") {
                    2
                } else if label.starts_with("repl1") {
                    3
                } else if label.starts_with("repl5") {
                    4
                } else {
                    1
                };
                Series { dashed: label.contains("network"), color: Some(color), label, points }
            })
            .collect::<Vec<_>>()
    };
    if report.rows.iter().any(|r| r.figure == "fig5.1") {
        let panels: Vec<Panel> = [1u64, 10]
            .iter()
            .map(|&h| Panel {
                title: format!("{h} µs handler"),
                x_label: "achieved throughput (k requests/s)".into(),
                y_label: "p99 latency (µs)".into(),
                log_y: true,
                series: series_of("fig5.1", &|r: &Row| r.handler_us == h),
            })
            .collect();
        write_png(
            &out.join("fig5_1.png"),
            "r3p2 Fig. 5.1: unreplicated vs replicated (3), worker vs network thread (dashed)",
            &panels,
            2,
        )?;
    }
    if report.rows.iter().any(|r| r.figure == "fig5.2") {
        let h = report.rows.iter().find(|r| r.figure == "fig5.2").map_or(0, |r| r.handler_us);
        let panels = vec![Panel {
            title: format!("replicated, {h} µs handler, worker thread"),
            x_label: "achieved throughput (k requests/s)".into(),
            y_label: "p99 latency (µs)".into(),
            log_y: true,
            series: series_of("fig5.2", &|_| true),
        }];
        write_png(&out.join("fig5_2.png"), "r3p2 Fig. 5.2: 1, 3, 5 members", &panels, 1)?;
    }
    Ok(())
}

/// Prints the report as tables.
pub fn print_table(report: &Report) {
    println!("ordo bench r3p2 — {}", report.machine.summary());
    println!(
        "{:<7} {:<22} {:>4} {:>10} {:>10} {:>10} {:>9} {:>10} {:>7} {:>5} {:>8} {:>8} {:>8} {:>8} {:>5}",
        "figure",
        "series",
        "µs",
        "offered/s",
        "sent/s",
        "achieved/s",
        "p50 µs",
        "p99 µs",
        "errors",
        "ok",
        "srv cpu%",
        "max srv%",
        "cli cpu%",
        "udp drop",
        "load"
    );
    for r in &report.rows {
        println!(
            "{:<7} {:<22} {:>4} {:>10.0} {:>10.0} {:>10.0} {:>9.1} {:>10.1} {:>7} {:>5} {:>8.0} {:>8.0} {:>8.0} {:>8} {:>5.1}",
            r.figure,
            r.series,
            r.handler_us,
            r.offered_rps,
            r.sent_rps,
            r.achieved_rps,
            r.latency_ns_p50 as f64 / 1e3,
            r.latency_ns_p99 as f64 / 1e3,
            r.errors,
            if r.keeps_up { "yes" } else { "no" },
            r.server_cpu_percent,
            r.busiest_server_cpu_percent,
            r.client_cpu_percent,
            r.udp_rcvbuf_drops,
            r.loadavg_1m
        );
    }
    let k = |v: Option<f64>| v.map_or("-".to_string(), |v| format!("{:.1}k", v / 1e3));
    println!(
        "\nPer configuration (peak: highest achieved rate that keeps up with p99 ≤ {} µs; at SLO: p99 ≤ SLO)",
        report.peak_p99_us
    );
    for c in &report.configs {
        let slos: Vec<String> = c.at_slo_rps.iter().map(|(s, v)| format!("@{s}µs {}", k(*v))).collect();
        println!(
            "  {:<7} {:<22} {:>3} µs  peak {:>8}  max sustained {:>8}  {}  light-load p99 {} µs  (idle: {})",
            c.figure,
            c.series,
            c.config.handler_us,
            k(c.peak_rps),
            k(c.max_sustained_rps),
            slos.join("  "),
            c.light_latency_ns_p99.map_or("-".into(), |v| format!("{:.1}", v as f64 / 1e3)),
            c.server_idle
        );
    }
    if let Some((p50, p99)) = report.udp_round_trip_ns {
        println!(
            "\nLight-load p50 against a busy-polled UDP round trip with plain sockets on loopback, measured in this \
             run: p50 {:.1} µs, p99 {:.1} µs back to back",
            p50 / 1e3,
            p99 / 1e3
        );
        let light = report.udp_round_trip_light_ns;
        if let Some((l50, l99)) = light {
            println!(
                "  and with the pings spaced as the light load's requests ({:.0}/s, Poisson): p50 {:.1} µs, p99 {:.1} µs",
                report.light_rps,
                l50 / 1e3,
                l99 / 1e3
            );
        }
        for c in &report.configs {
            if let Some(l) = c.light_latency_ns_p50 {
                let spaced = light.map_or(String::new(), |(l50, _)| {
                    format!(", {:.1}× the round trip at that spacing", l as f64 / l50)
                });
                println!(
                    "  {:<7} {:<22} {:>3} µs  light-load p50 {:>7.1} µs = {:.1}× the back-to-back round trip{spaced}",
                    c.figure,
                    c.series,
                    c.config.handler_us,
                    l as f64 / 1e3,
                    l as f64 / p50
                );
            }
        }
    }
    if !report.peak_loss.is_empty() {
        println!("\nPeak loss, interleaved (each side a fresh cluster per round; median [min–max]):");
        for c in &report.peak_loss {
            println!("  {}", c.line(|v| format!("{:.1}k/s", v / 1e3)));
        }
    }
    if !report.light_overhead.is_empty() {
        println!(
            "\nReplication's light-load overhead, interleaved (each side a fresh cluster per round; overhead: 3 replicas − unreplicated per clean round, median [min–max]):"
        );
        for c in &report.light_overhead {
            println!("  {}", c.line_with_difference("overhead", |v| format!("{v:.1} µs")));
        }
    }
    if !report.calls.is_empty() {
        println!(
            "\nBlocking Client::call at light load, the client's idle strategy, interleaved (median [min–max]):"
        );
        for c in &report.calls {
            println!("  {}", c.line(|v| format!("{v:.1} µs")));
        }
    }
    if !report.leader_cost.is_empty() {
        println!(
            "\nNetwork thread's work per request, in memory on one thread, no system calls (median [min–max]; the peak ratio a leader-bound group can reach is its inverse):"
        );
        for c in &report.leader_cost {
            println!("  {}", c.line_with_difference("extra", |v| format!("{v:.0} ns")));
        }
    }
    let us = |v: Option<f64>| v.map_or("-".to_string(), |v| format!("{v:+.1}"));
    if !report.replication_cost.is_empty() {
        println!(
            "\nReplicated (3) vs unreplicated (thesis, DPDK: ~13 % peak loss, +10-13 µs p99 at equal load)"
        );
        for c in &report.replication_cost {
            println!(
                "  {:>2} µs {:<8} peak {} -> {} ({} loss); max sustained {} -> {} ({} loss); p99 overhead {} µs at {} offered/s, {} µs at {} offered/s (p50 {} µs)",
                c.handler_us,
                c.mode,
                k(c.unreplicated_peak_rps),
                k(c.replicated_peak_rps),
                c.peak_loss_percent.map_or("-".into(), |v| format!("{v:.1} %")),
                k(c.unreplicated_max_sustained_rps),
                k(c.replicated_max_sustained_rps),
                c.max_sustained_loss_percent.map_or("-".into(), |v| format!("{v:.1} %")),
                us(c.light_p99_overhead_us),
                opt(c.light_offered_rps, 0),
                us(c.moderate_p99_overhead_us),
                opt(c.moderate_offered_rps, 0),
                us(c.moderate_p50_overhead_us),
            );
        }
    }
    if !report.auth_cost.is_empty() {
        println!("\nAuthenticated vs unauthenticated replica traffic (3 replicas, same run, in lockstep)");
        let ns = |v: Option<u64>| v.map_or("-".to_string(), |v| format!("{:.1}", v as f64 / 1e3));
        for c in &report.auth_cost {
            println!(
                "  {:>2} µs workers  peak {} (auth) vs {} (none): {} loss; max sustained {} vs {}; light load p50 {} vs {} µs, p99 {} vs {} µs",
                c.handler_us,
                k(c.auth_peak_rps),
                k(c.noauth_peak_rps),
                c.peak_loss_percent.map_or("-".into(), |v| format!("{v:.1} %")),
                k(c.auth_max_sustained_rps),
                k(c.noauth_max_sustained_rps),
                ns(c.auth_light_p50_ns),
                ns(c.noauth_light_p50_ns),
                ns(c.auth_light_p99_ns),
                ns(c.noauth_light_p99_ns),
            );
        }
    }
    if !report.worker_gain.is_empty() {
        println!("\nWorker thread vs network thread, throughput at a p99 SLO (thesis: 2x at 200 µs)");
        for g in &report.worker_gain {
            println!(
                "  SLO {:>5} µs {:>2} µs {:<16} workers {:>8} network {:>8} ratio {}",
                g.slo_us,
                g.handler_us,
                g.policy,
                k(g.workers_rps),
                k(g.network_rps),
                g.ratio.map_or("-".into(), |v| format!("{v:.2}x"))
            );
        }
    }
    println!("\nwall time {:.0} s; files: {}", report.wall_s, report.out_dir);
}
