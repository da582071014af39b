//! Presentation: what every operator surface of hvstats shows, derived from the catalog, in one
//! library the command and the benches share.
//!
//! - [`live`]: readings of every live instance of a runtime directory;
//! - [`present`]: counters over an interval as perfmon presents them (rates, percentages,
//!   average costs);
//! - [`metrics`]: metric families for exporters (names, units, help, the intercept label);
//! - [`collectors`]: the named groups of metric families `serve` turns on and off;
//! - [`protobuf`]: the Prometheus protobuf format, with native histograms;
//! - [`exposition`]: a reading as a Prometheus / OpenMetrics exposition, and the exporter's
//!   health;
//! - [`snapshot_json`]: a reading as `snapshot --json` and the snapshot API give it;
//! - [`json_keys`]: the keys of counters in JSON, saying what each value holds, and the schema
//!   version every JSON document carries;
//! - [`text`]: names others choose, made safe to print.

#![deny(missing_docs)]

pub mod collectors;
pub mod exposition;
pub mod json_keys;
pub mod live;
pub mod metrics;
pub mod present;
pub mod protobuf;
mod sink;
pub mod snapshot_json;
pub mod text;
