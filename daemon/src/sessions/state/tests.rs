use super::*;

#[test]
fn state_names_round_trip() {
    for s in [State::Pending, State::Active, State::Stopping, State::Completed, State::Failed, State::Interrupted] {
        assert_eq!(State::parse(s.as_str()), Some(s));
        assert_eq!(State::from_pb(s.to_pb()), Some(s));
    }
}
