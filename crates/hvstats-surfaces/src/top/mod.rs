//! What `hvstats top` shows: its table of two readings ([`table`]), which two readings those are
//! ([`baseline`]), and its live view: the state and what each key does to it ([`app`]), drawn by
//! [`screen`].

pub mod app;
pub mod baseline;
pub mod screen;
pub mod table;
