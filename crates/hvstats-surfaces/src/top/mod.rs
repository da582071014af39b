//! What `hvstats top` shows: its table of two readings ([`table`]) and which two readings those
//! are ([`baseline`]).

pub mod baseline;
pub mod table;
