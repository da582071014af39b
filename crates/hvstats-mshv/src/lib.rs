//! The Microsoft Hypervisor's own counters where Linux is its root partition (`mshv_root`): its
//! debugfs tree of `stats` files, read as text, mapped by name into the catalog and published as
//! an hvstats instance that every reader (`snapshot`, `top`, `serve`, `record`) shows.
//!
//! - [`stats_file`]: one file's lines, parsed as untrusted text;
//! - [`tree`]: the tree's objects (hypervisor, LPs, partitions, VPs), read once;
//! - [`names`]: the one table from printed names to catalog counters, and every counter's one
//!   name;
//! - [`dialect`]: how each kernel prints the tree — mainline Linux, Microsoft's kernel tree and
//!   its older revision — with their name tables; [`synthetic`] writes trees exactly so;
//! - [`observer`]: the tree published as an instance, one refresh per tick; the values the catalog
//!   has no counter for go beside the pages ([`hvstats::unmapped`]).
//!
//! The crate needs only the statistics authority (`hvstats`) and the catalog (`hvstats-abi`):
//! nothing of KVM.

#![deny(missing_docs)]

pub mod dialect;
pub mod names;
pub mod observer;
pub mod stats_file;
pub mod synthetic;
pub mod tree;
