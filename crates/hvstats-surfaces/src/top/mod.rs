//! What `hvstats top` shows: its table of two readings ([`table`]).

pub mod table;
