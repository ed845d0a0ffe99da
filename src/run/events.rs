//! Events about pods, written to `events.k8s.io/v1` as client-go's event broadcaster (and
//! kube-runtime's `Recorder`) writes them: the first event of a kind about an object is
//! created; a repeat within six minutes (same object, type, reason, action and related
//! object) patches the first one's `series` (count, lastObservedTime) instead.
//!
//! The [`Recorder`] remembers, per kind and object, only what that patch needs: the
//! event's name, its count and when it was last seen. kube-runtime's keeps every whole
//! event it wrote for six minutes and sweeps them all on every write; in benches/e2e's
//! template run (one `Scheduled` event per pod) that table was 12 MB of the daemon's peak
//! heap (heaptrack), about 2.3 KB an event, against about 0.2 KB here.

use std::collections::HashMap;
use std::sync::Mutex;

use k8s_openapi::api::core::v1::ObjectReference;
use k8s_openapi::api::events::v1::Event as ApiEvent;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{MicroTime, ObjectMeta};
use k8s_openapi::jiff::{SignedDuration, Timestamp};
use kube::Client;
use kube::api::{Api, Patch, PatchParams, PostParams};
use kube::runtime::events::{Event, EventType, Reporter};

/// How long after its last observation a repeat still counts in an event's series
/// (client-go's and kube-runtime's six minutes).
const SERIES_TTL: SignedDuration = SignedDuration::from_mins(6);

/// How often entries past [`SERIES_TTL`] are swept out (a lookup ignores them anyway).
const SWEEP_EVERY: SignedDuration = SignedDuration::from_secs(30);

/// Writes events, turning repeats into series.
pub(crate) struct Recorder {
    client: Client,
    reporter: Reporter,
    series: Mutex<Series>,
}

impl Recorder {
    pub(crate) fn new(client: Client, reporter: Reporter) -> Self {
        Recorder {
            client,
            reporter,
            series: Mutex::new(Series::default()),
        }
    }

    /// Create the event, or patch the series of the same event written less than six
    /// minutes ago.
    pub(crate) async fn publish(
        &self,
        event: &Event,
        regarding: &ObjectReference,
    ) -> Result<(), kube::Error> {
        let now = Timestamp::now();
        let key = SeriesKey::of(event, regarding);
        let seen = self.series.lock().expect("not poisoned").observe(&key, now);
        let namespace = regarding.namespace.as_deref().unwrap_or("default");
        let events: Api<ApiEvent> = Api::namespaced(self.client.clone(), namespace);
        match seen {
            Seen::Repeat { name, count } => {
                let patch = serde_json::json!({"series": {
                    "count": count, "lastObservedTime": MicroTime(now)}});
                events
                    .patch(&name, &PatchParams::default(), &Patch::Merge(&patch))
                    .await?;
            }
            Seen::First => {
                let created = self.event(event, regarding, now);
                let name = created.metadata.name.clone().unwrap_or_default();
                events.create(&PostParams::default(), &created).await?;
                let mut series = self.series.lock().expect("not poisoned");
                series.started(key, name.into(), now);
            }
        }
        Ok(())
    }

    /// The event as the API takes it, named after the object and the time.
    fn event(&self, event: &Event, regarding: &ObjectReference, now: Timestamp) -> ApiEvent {
        let controller = &self.reporter.controller;
        let object = regarding.name.as_ref().unwrap_or(controller);
        ApiEvent {
            action: Some(event.action.clone()),
            reason: Some(event.reason.clone()),
            event_time: Some(MicroTime(now)),
            regarding: Some(regarding.clone()),
            related: event.secondary.clone(),
            note: event.note.clone(),
            metadata: ObjectMeta {
                namespace: regarding.namespace.clone(),
                name: Some(format!("{object}.{:x}", now.as_nanosecond())),
                ..Default::default()
            },
            reporting_controller: Some(controller.clone()),
            reporting_instance: Some(self.reporter.instance.clone().unwrap_or(controller.clone())),
            type_: Some(type_name(event.type_).to_string()),
            ..Default::default()
        }
    }
}

fn type_name(type_: EventType) -> &'static str {
    match type_ {
        EventType::Normal => "Normal",
        EventType::Warning => "Warning",
    }
}

/// What makes two events the same event: the object they are about (kind, namespace,
/// name, uid), their type, reason and action, and the related object.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
struct SeriesKey(Box<str>);

impl SeriesKey {
    fn of(event: &Event, regarding: &ObjectReference) -> SeriesKey {
        let object = |r: &ObjectReference| {
            let field = |f: &Option<String>| f.as_deref().unwrap_or_default().to_string();
            [&r.kind, &r.namespace, &r.name, &r.uid]
                .map(field)
                .join("/")
        };
        let related = event.secondary.as_ref().map(object).unwrap_or_default();
        let parts = [
            type_name(event.type_),
            &event.reason,
            &event.action,
            &object(regarding),
            &related,
        ];
        // NUL cannot appear in any of these, so the joined key is unambiguous.
        SeriesKey(parts.join("\0").into())
    }
}

/// What a write of an event should be.
#[derive(Debug, PartialEq, Eq)]
enum Seen {
    /// A new event.
    First,
    /// The `count`th time of the event called `name`: a patch of its series.
    Repeat { name: Box<str>, count: i32 },
}

/// The events written in the last six minutes: name, count and last time of each.
#[derive(Debug, Default)]
struct Series {
    written: HashMap<SeriesKey, Written>,
    swept: Option<Timestamp>,
}

#[derive(Debug)]
struct Written {
    name: Box<str>,
    count: i32,
    last: Timestamp,
}

impl Series {
    /// Whether an event with this key at `now` is new or a repeat (counted here).
    fn observe(&mut self, key: &SeriesKey, now: Timestamp) -> Seen {
        self.sweep(now);
        match self.written.get_mut(key) {
            Some(w) if w.last + SERIES_TTL > now => {
                w.count = w.count.saturating_add(1);
                w.last = now;
                Seen::Repeat {
                    name: w.name.clone(),
                    count: w.count,
                }
            }
            _ => Seen::First,
        }
    }

    /// The event `name` was created for `key` at `now`: later repeats patch it.
    fn started(&mut self, key: SeriesKey, name: Box<str>, now: Timestamp) {
        let written = Written {
            name,
            count: 1,
            last: now,
        };
        self.written.insert(key, written);
    }

    /// Forget, at most every [`SWEEP_EVERY`], the events not seen for six minutes.
    fn sweep(&mut self, now: Timestamp) {
        if self.swept.is_some_and(|t| t + SWEEP_EVERY > now) {
            return;
        }
        self.swept = Some(now);
        self.written.retain(|_, w| w.last + SERIES_TTL > now);
        self.written.shrink_to_fit();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pod(name: &str, uid: &str) -> ObjectReference {
        ObjectReference {
            kind: Some("Pod".into()),
            api_version: Some("v1".into()),
            namespace: Some("team-a".into()),
            name: Some(name.into()),
            uid: Some(uid.into()),
            ..Default::default()
        }
    }

    fn failed(note: &str) -> Event {
        Event {
            type_: EventType::Warning,
            reason: "FailedScheduling".into(),
            note: Some(note.into()),
            action: "Scheduling".into(),
            secondary: None,
        }
    }

    fn at(seconds: i64) -> Timestamp {
        Timestamp::from_second(1_800_000_000 + seconds).unwrap()
    }

    #[test]
    fn a_repeat_within_six_minutes_counts_in_the_first_events_series() {
        let mut series = Series::default();
        let key = SeriesKey::of(&failed("0/3 nodes"), &pod("trainer", "u1"));
        assert_eq!(series.observe(&key, at(0)), Seen::First);
        series.started(key.clone(), "trainer.1".into(), at(0));
        // The note is not part of the key: a different message is the same event again.
        let again = SeriesKey::of(&failed("0/4 nodes"), &pod("trainer", "u1"));
        assert_eq!(again, key);
        for (seconds, count) in [(60, 2), (400, 3), (700, 4)] {
            assert_eq!(
                series.observe(&key, at(seconds)),
                Seen::Repeat {
                    name: "trainer.1".into(),
                    count
                }
            );
        }
    }

    #[test]
    fn six_minutes_of_silence_start_a_new_event() {
        let mut series = Series::default();
        let key = SeriesKey::of(&failed("0/3 nodes"), &pod("trainer", "u1"));
        series.started(key.clone(), "trainer.1".into(), at(0));
        assert_eq!(series.observe(&key, at(360)), Seen::First);
        series.started(key.clone(), "trainer.2".into(), at(360));
        let repeat = series.observe(&key, at(361));
        let expected = Seen::Repeat {
            name: "trainer.2".into(),
            count: 2,
        };
        assert_eq!(repeat, expected);
    }

    #[test]
    fn events_about_other_objects_or_of_other_reasons_are_other_events() {
        let key = SeriesKey::of(&failed("x"), &pod("trainer", "u1"));
        let other_uid = SeriesKey::of(&failed("x"), &pod("trainer", "u2"));
        let other_pod = SeriesKey::of(&failed("x"), &pod("server", "u1"));
        let scheduled = Event {
            type_: EventType::Normal,
            reason: "Scheduled".into(),
            ..failed("x")
        };
        let other_reason = SeriesKey::of(&scheduled, &pod("trainer", "u1"));
        let related = Event {
            secondary: Some(pod("victim", "u9")),
            ..failed("x")
        };
        let with_related = SeriesKey::of(&related, &pod("trainer", "u1"));
        for other in [other_uid, other_pod, other_reason, with_related] {
            assert_ne!(other, key);
        }
    }

    #[test]
    fn a_sweep_forgets_what_was_not_seen_for_six_minutes() {
        let mut series = Series::default();
        let old = SeriesKey::of(&failed("x"), &pod("old", "u1"));
        let recent = SeriesKey::of(&failed("x"), &pod("recent", "u2"));
        series.started(old.clone(), "old.1".into(), at(0));
        series.started(recent.clone(), "recent.1".into(), at(300));
        let fresh = SeriesKey::of(&failed("x"), &pod("fresh", "u3"));
        assert_eq!(series.observe(&fresh, at(400)), Seen::First);
        assert!(!series.written.contains_key(&old));
        assert!(series.written.contains_key(&recent));
    }
}
