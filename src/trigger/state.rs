//! What a trigger is doing, as `stats`, the admin API and the console name it.

/// A trigger's state: claiming, paused by an operator, or held because one of its own
/// destinations fails.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum State {
    /// Claiming as its members fall due.
    Active,
    /// Paused by an operator: nothing is claimed until a resume.
    Paused,
    /// One of its own destinations failed: its messages wait in Redis until one goes through.
    Held,
}

impl State {
    /// The state of a trigger paused or not, held or not: a pause, the operator's act, says
    /// more than a hold.
    pub(crate) fn of(paused: bool, held: bool) -> Self {
        if paused {
            Self::Paused
        } else if held {
            Self::Held
        } else {
            Self::Active
        }
    }

    /// Its name in `stats`, the admin API and the console.
    pub(crate) fn as_str(self) -> &'static str {
        match self {
            Self::Active => "active",
            Self::Paused => "paused",
            Self::Held => "held",
        }
    }
}

#[cfg(test)]
mod tests {
    use super::State;

    #[test]
    fn a_pause_says_more_than_a_hold() {
        assert_eq!(State::of(true, true), State::Paused);
        assert_eq!(State::of(false, true).as_str(), "held");
        assert_eq!(State::of(false, false).as_str(), "active");
    }
}
