//! The Microsoft Hypervisor's own counters where Linux is its root partition (`mshv_root`): its
//! debugfs tree of `stats` files, read as text and mapped by name into the catalog.
//!
//! - [`stats_file`]: one file's lines, parsed as untrusted text;
//! - [`tree`]: the tree's objects (hypervisor, LPs, partitions, VPs), read once;
//! - [`names`]: the one table from printed names to catalog counters;
//! - [`reference`](mod@reference): the names Linux prints, by counter id (for trees in the kernel's format and
//!   for telling a known name from an unknown one); [`synthetic`] writes such trees;
//! - [`unmapped`]: the values of names the catalog has no counter for, kept beside the pages.
//!
//! Nothing here publishes: the observer that turns a tree into an instance lives with the other
//! observers, in `hvstats-kvm`.

pub mod names;
pub mod reference;
pub mod stats_file;
pub mod synthetic;
pub mod tree;
pub mod unmapped;
