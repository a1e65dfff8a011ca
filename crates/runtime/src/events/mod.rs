//! Container lifecycle events: the mailbox and the CRI event stream.
pub mod mailbox;

pub use mailbox::{Lagged, Mailbox, MailboxStats, Subscription};
