//! The one shape every benchmark has: a plan of points, each measured into
//! rows; the rows (and summaries) form a report that is written as files
//! (CSV, PNG, JSON) and printed as tables or as one JSON object.
//!
//! `ordo bench fabric|spindle|acuerdo|r3p2` all run through [`run`]; a new
//! benchmark (failover, kv, dds) implements [`Experiment`] and gets the
//! progress lines, the output directory, `--json` and the report printer for
//! free. Arguments are clap structs the CLI embeds as subcommands.
//!
//! # Invariants
//! - Every figure in a report comes from a measurement of the same
//!   invocation (the benchmarks' own rule, see the crate docs).
//! - With `--json` stdout carries exactly one JSON object (progress goes to
//!   stderr, and only without `--json`).
//! - Files are written before anything is printed, so a report on screen
//!   always has its files on disk; `report.json` beside them is the same
//!   object `--json` prints.

use serde::Serialize;
use std::path::Path;

/// One benchmark (see the module docs).
pub trait Experiment {
    /// The whole result: machine, rows, summaries (`--json` prints it).
    type Report: Serialize;

    /// `ordo bench <name>`.
    fn name(&self) -> &'static str;

    /// Runs the plan: measures every point (one progress line per step).
    fn measure(&self, progress: &mut dyn FnMut(&str)) -> Result<Self::Report, String>;

    /// Where the files go (`None`: the benchmark writes none).
    fn out_dir(&self) -> Option<&Path> {
        None
    }

    /// Writes the CSV and PNG files of `report` into `dir` (which exists).
    fn write_files(&self, report: &Self::Report, dir: &Path) -> Result<(), String> {
        let _ = (report, dir);
        Ok(())
    }

    /// Prints `report` as tables.
    fn print_table(&self, report: &Self::Report);

    /// An error to return after printing (e.g. points that failed).
    fn verdict(&self, report: &Self::Report) -> Result<(), String> {
        let _ = report;
        Ok(())
    }
}

/// Runs `experiment`: measure, write files (and `report.json`), print.
pub fn run<E: Experiment>(experiment: &E, json: bool) -> Result<(), String> {
    let mut progress = |line: &str| {
        if !json {
            eprintln!("  {line}");
        }
    };
    let report = experiment.measure(&mut progress)?;
    if let Some(dir) = experiment.out_dir() {
        std::fs::create_dir_all(dir).map_err(|e| format!("{}: {e}", dir.display()))?;
        experiment.write_files(&report, dir)?;
        let text = serde_json::to_string_pretty(&report).map_err(|e| e.to_string())?;
        write(&dir.join("report.json"), &text)?;
    }
    if json {
        println!("{}", serde_json::to_string_pretty(&report).map_err(|e| e.to_string())?);
    } else {
        experiment.print_table(&report);
    }
    experiment.verdict(&report)
}

/// Writes `text` to `path`, naming the path in the error.
pub fn write(path: &Path, text: &str) -> Result<(), String> {
    std::fs::write(path, text).map_err(|e| format!("{}: {e}", path.display()))
}

/// A CSV document: a header, then rows of fields (quoted where needed).
#[derive(Debug)]
pub struct Csv {
    text: String,
    columns: usize,
}

impl Csv {
    /// A document with these column names.
    pub fn new(header: &[&str]) -> Csv {
        assert!(!header.is_empty(), "a CSV has columns");
        let mut csv = Csv { text: String::new(), columns: header.len() };
        csv.push_line(header.iter().map(|h| h.to_string()));
        csv
    }

    /// Appends one row; it must have one field per column.
    pub fn row(&mut self, fields: impl IntoIterator<Item = String>) {
        let before = self.text.len();
        let n = self.push_line(fields);
        assert_eq!(n, self.columns, "a CSV row has one field per column: {}", &self.text[before..]);
    }

    fn push_line(&mut self, fields: impl IntoIterator<Item = String>) -> usize {
        let mut n = 0;
        for f in fields {
            if n > 0 {
                self.text.push(',');
            }
            self.text.push_str(&Csv::field(&f));
            n += 1;
        }
        self.text.push('\n');
        n
    }

    /// `s` as one CSV field (quoted when it holds a comma, quote or newline).
    pub fn field(s: &str) -> String {
        if s.contains([',', '"', '\n']) { format!("\"{}\"", s.replace('"', "\"\"")) } else { s.to_string() }
    }

    /// An optional value (empty when absent).
    pub fn opt<T: ToString>(v: Option<T>) -> String {
        v.map_or(String::new(), |v| v.to_string())
    }

    /// The document.
    pub fn text(&self) -> &str {
        &self.text
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn csv_quotes_what_needs_it_and_counts_fields() {
        let mut csv = Csv::new(&["a", "b"]);
        csv.row(["x,y".to_string(), "say \"hi\"".to_string()]);
        csv.row(["1".to_string(), Csv::opt::<u32>(None)]);
        assert_eq!(csv.text(), "a,b\n\"x,y\",\"say \"\"hi\"\"\"\n1,\n");
        let short = std::panic::catch_unwind(move || {
            let mut c = Csv::new(&["a", "b"]);
            c.row(["only".to_string()]);
        });
        assert!(short.is_err(), "a row with a missing field is a bug");
    }
}
