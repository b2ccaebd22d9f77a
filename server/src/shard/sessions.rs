//! The sessions a shard holds for other shards: a streamed read or PUT
//! opened on this (owner) shard by a caller on another one, kept in a
//! bounded table between operations, closed by the caller or expired when
//! idle.

use std::time::Instant;

use super::msg::{SessionId, ShardError};
use super::{Shard, SESSIONS_MAX};
use crate::store::{ObjectReader, PutWriter};

#[allow(clippy::large_enum_variant)] // one per streamed GET/PUT; boxing the writer would add an allocation per PUT
pub(super) enum Session {
    Read(ObjectReader),
    Put(PutWriter),
}

/// A session held for another shard, in the owner's table.
pub(super) struct SessionSlot {
    state: SessionState,
    /// When the last operation on it ended (or it was opened).
    last_used: Instant,
}

#[allow(clippy::large_enum_variant)] // one per session, in a bounded table
pub(super) enum SessionState {
    /// Between operations.
    Idle(Session),
    /// An operation (ReadChunk, PutData, PutFinish) has it out of the table.
    /// `close`: a close arrived meanwhile; the session ends when the
    /// operation gives it back.
    Busy { close: bool },
}

impl Shard {
    /// Sessions this shard holds for other shards (open reads and PUTs).
    pub fn sessions_open(&self) -> usize {
        self.sessions.borrow().len()
    }
    pub(super) fn new_session(&self, s: Session) -> Result<SessionId, ShardError> {
        let mut sessions = self.sessions.borrow_mut();
        if sessions.len() >= SESSIONS_MAX {
            return Err(ShardError::Busy);
        }
        let id = self.next_session.get();
        self.next_session.set(id + 1);
        sessions.insert(
            id,
            SessionSlot {
                state: SessionState::Idle(s),
                last_used: Instant::now(),
            },
        );
        Ok(id)
    }

    /// Takes a session out of the table for one operation; it stays listed
    /// (busy) so that a close arriving meanwhile is not lost.
    pub(super) fn session_take(&self, id: SessionId) -> Result<Session, ShardError> {
        let mut sessions = self.sessions.borrow_mut();
        let Some(slot) = sessions.get_mut(&id) else {
            return Err(ShardError::Internal(
                "unknown session (closed, or expired after being idle)".into(),
            ));
        };
        match std::mem::replace(&mut slot.state, SessionState::Busy { close: false }) {
            SessionState::Idle(s) => Ok(s),
            busy @ SessionState::Busy { .. } => {
                slot.state = busy;
                Err(ShardError::Internal(
                    "session already has an operation in progress".into(),
                ))
            }
        }
    }

    /// Gives a session back after an operation, or ends it if a close came
    /// while the operation ran.
    pub(super) fn session_return(&self, id: SessionId, s: Session) {
        let mut sessions = self.sessions.borrow_mut();
        match sessions.get_mut(&id) {
            Some(slot) if matches!(slot.state, SessionState::Busy { close: false }) => {
                slot.state = SessionState::Idle(s);
                slot.last_used = Instant::now();
            }
            _ => {
                sessions.remove(&id);
                drop(sessions);
                self.session_ended(s);
            }
        }
    }

    /// Removes a session taken by `session_take` that its operation used up
    /// (finished or failed); the caller disposes of it.
    pub(super) fn session_remove(&self, id: SessionId) {
        self.sessions.borrow_mut().remove(&id);
    }

    /// Closes a session now, or when its running operation ends.
    pub(super) fn session_close(&self, id: SessionId) {
        let mut sessions = self.sessions.borrow_mut();
        let Some(slot) = sessions.get_mut(&id) else {
            return;
        };
        match &mut slot.state {
            SessionState::Busy { close } => *close = true,
            SessionState::Idle(_) => {
                let slot = sessions.remove(&id).expect("listed");
                drop(sessions);
                if let SessionState::Idle(s) = slot.state {
                    self.session_ended(s);
                }
            }
        }
    }

    /// Releases what a session held: its reader, or its unfinished PUT (the
    /// writer's pinned segments, and the bucket's in-flight count).
    pub(super) fn session_ended(&self, s: Session) {
        if let Session::Put(w) = s {
            self.put_ended(w.bucket());
        }
    }

    /// Closes sessions idle for longer than `session_idle_timeout`: their
    /// caller went away without closing them (or its close was lost).
    pub fn expire_idle_sessions(&self) {
        let idle = self.session_idle_timeout.get();
        let now = Instant::now();
        let expired: Vec<Session> = {
            let mut sessions = self.sessions.borrow_mut();
            let ids: Vec<SessionId> = sessions
                .iter()
                .filter(|(_, slot)| {
                    matches!(slot.state, SessionState::Idle(_))
                        && now.saturating_duration_since(slot.last_used) > idle
                })
                .map(|(id, _)| *id)
                .collect();
            ids.iter()
                .filter_map(|id| match sessions.remove(id)?.state {
                    SessionState::Idle(s) => Some(s),
                    SessionState::Busy { .. } => None,
                })
                .collect()
        };
        if expired.is_empty() {
            return;
        }
        self.sessions_expired
            .set(self.sessions_expired.get() + expired.len() as u64);
        tracing::warn!(
            shard = self.id,
            count = expired.len(),
            "closed sessions idle for more than {idle:?}"
        );
        for s in expired {
            self.session_ended(s);
        }
    }
}
