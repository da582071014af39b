//! What the `hvstats` command shows beyond a snapshot, as a library the command calls with its
//! parsed flags:
//!
//! - [`recording`]: the recording format `record` writes and its reader, one VP at a time;
//! - [`report`]: what a recording says per VP, as text or JSON;
//! - [`chart`]: charts of a recording's VP counters over time, as PNG or SVG;
//! - [`top`]: `top`'s table of two readings and which two readings those are.
//!
//! Counters a source cannot maintain stay absent here as everywhere: `null` or `-`, never 0.

#![deny(missing_docs)]

pub mod chart;
pub mod recording;
pub mod report;
pub mod top;
