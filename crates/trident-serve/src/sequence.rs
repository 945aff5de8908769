//! Triton's sequence batcher for stateful models (`sequence_batching`).
//!
//! Each request of a sequence carries a correlation ID and START / END flags. The
//! sequencer checks them (a sequence begins with START; an ID idle longer than
//! `max_sequence_idle_microseconds` is released, so its next request must START
//! again), runs the requests of one sequence one at a time and in arrival order, and
//! gives the model what Triton's control inputs promise: START, END, READY and CORRID
//! tensors per row, in the types the config's controls give. With `state` (implicit
//! state), the state input of each request is the state output of the one before
//! (zeros, or the configured initial state, at START); state tensors never reach the
//! client.
//!
//! Only so many sequences are active at once, as in Triton: with the Direct strategy
//! (the default) one per batch slot, `max_batch_size` (at least 1) times the number of
//! instances; with Oldest, `max_candidate_sequences` (0: no limit). A sequence that
//! STARTs while all are taken waits in an ordered backlog, its requests held, until
//! an active sequence ENDs or is released as idle.
//!
//! Requests of different active sequences batch together through the model's scheduler
//! (the Oldest strategy's behaviour). Slots are not pinned to instances as Triton's
//! Direct strategy pins them: that matters only to backends that keep per-slot state
//! inside the instance, and every Trident backend is stateless between executions
//! (state lives here, per sequence).

use crate::{ConfigError, ServeError};
use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};
use trident_core::config::pb::model_sequence_batching::{control::Kind, initial_state, Control};
use trident_core::config::{self, pb, ModelConfig};
use trident_core::{DataType, Tensor};

/// A sequence's correlation ID: an unsigned integer or a string (Triton accepts both).
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub enum CorrelationId {
    /// A non-zero integer ID.
    U64(u64),
    /// A non-empty string ID (at most 128 bytes).
    Str(String),
}

impl std::fmt::Display for CorrelationId {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            CorrelationId::U64(v) => write!(f, "{v}"),
            CorrelationId::Str(s) => f.write_str(s),
        }
    }
}

/// The sequence parameters of one request.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SequenceFlags {
    /// The sequence.
    pub id: CorrelationId,
    /// First request of the sequence.
    pub start: bool,
    /// Last request of the sequence.
    pub end: bool,
}

/// Longest string correlation ID (Triton's limit).
pub const MAX_STRING_ID: usize = 128;

impl SequenceFlags {
    /// Flags from the protocol's parameters; `None` when no sequence is named (ID 0 or
    /// empty, Triton's "no sequence").
    pub fn new(id: Option<CorrelationId>, start: bool, end: bool) -> Result<Option<Self>, FlagsError> {
        let id = match id {
            None | Some(CorrelationId::U64(0)) => None,
            Some(CorrelationId::Str(s)) if s.is_empty() => None,
            Some(CorrelationId::Str(s)) if s.len() > MAX_STRING_ID => {
                return Err(FlagsError::IdTooLong {
                    len: s.len(),
                    max: MAX_STRING_ID,
                })
            }
            Some(id) => Some(id),
        };
        match id {
            Some(id) => Ok(Some(SequenceFlags { id, start, end })),
            None if start || end => Err(FlagsError::MissingId),
            None => Ok(None),
        }
    }
}

/// A request's sequence parameters that do not make a sequence: the client's error.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum FlagsError {
    /// A string correlation ID over Triton's limit.
    #[error("string correlation ID cannot be longer than {max} characters")]
    IdTooLong {
        /// The ID's length in bytes.
        len: usize,
        /// The limit ([`MAX_STRING_ID`]).
        max: usize,
    },
    /// `sequence_start` or `sequence_end` without an ID.
    #[error("sequence_start / sequence_end need a sequence_id (a non-zero integer or a non-empty string)")]
    MissingId,
}

/// One control input: its name, what it signals and its values.
struct ControlInput {
    name: String,
    kind: Kind,
    /// Data type of the tensor.
    dtype: DataType,
    /// `[false, true]` element bytes (START/END/READY).
    values: [Vec<u8>; 2],
}

/// One implicit state.
struct StateSpec {
    input: String,
    output: String,
    dtype: DataType,
    dims: Vec<i64>,
}

/// A sequence in progress.
#[derive(Debug)]
pub(crate) struct Active {
    /// Implicit state tensors, in `states` order (empty before the first request).
    pub state: Vec<Tensor>,
}

struct Entry {
    slot: Arc<tokio::sync::Mutex<Active>>,
    last_used: Instant,
    /// Order of arrival in the backlog; `None` once the sequence is active.
    waiting: Option<u64>,
}

/// A model's sequence batcher.
pub(crate) struct Sequencer {
    model: String,
    batching: bool,
    idle: Duration,
    controls: Vec<ControlInput>,
    states: Vec<StateSpec>,
    active: Mutex<HashMap<CorrelationId, Entry>>,
    /// How many sequences may be active at once (`None`: no limit).
    capacity: Option<usize>,
    /// Next backlog ticket.
    tickets: std::sync::atomic::AtomicU64,
    /// Woken when an active sequence ends or is released.
    freed: tokio::sync::Notify,
}

/// The tensors the sequencer supplies and consumes, which clients never see: (inputs:
/// the control inputs and the state inputs, outputs: the state outputs).
pub(crate) fn hidden_tensors(config: &ModelConfig) -> (Vec<&str>, Vec<&str>) {
    let Some(pb::model_config::SchedulingChoice::SequenceBatching(sb)) = &config.scheduling_choice else {
        return (Vec::new(), Vec::new());
    };
    let inputs = sb
        .control_input
        .iter()
        .map(|c| c.name.as_str())
        .chain(sb.state.iter().map(|s| s.input_name.as_str()))
        .collect();
    (inputs, sb.state.iter().map(|s| s.output_name.as_str()).collect())
}

/// Triton's default idle time of a sequence.
const DEFAULT_IDLE: Duration = Duration::from_secs(1);

impl Sequencer {
    /// The sequencer a config asks for, if any; an invalid `sequence_batching` is a
    /// load error naming what is wrong.
    pub fn from_config(config: &ModelConfig, instances: usize) -> Result<Option<Self>, ConfigError> {
        let bad = |why: String| ConfigError::new("sequence_batching", why);
        let Some(pb::model_config::SchedulingChoice::SequenceBatching(sb)) = &config.scheduling_choice else {
            return Ok(None);
        };
        let (inputs, outputs) = hidden_tensors(config);
        if let Some(clash) = config.input.iter().find(|i| inputs.contains(&i.name.as_str())) {
            return Err(bad(format!(
                "sequence_batching supplies input '{}' (a control or state input): it cannot also be a client input in the config's input list",
                clash.name
            )));
        }
        if let Some(clash) = config.output.iter().find(|o| outputs.contains(&o.name.as_str())) {
            return Err(bad(format!(
                "sequence_batching keeps output '{}' as the sequence's state: it cannot also be in the config's output list",
                clash.name
            )));
        }
        let mut controls = Vec::new();
        for input in &sb.control_input {
            let [control] = input.control.as_slice() else {
                return Err(bad(format!(
                    "sequence_batching control_input '{}' must have exactly one control, has {}",
                    input.name,
                    input.control.len()
                )));
            };
            controls.push(control_input(&input.name, control).map_err(bad)?);
        }
        let mut states = Vec::new();
        for s in &sb.state {
            let dtype = config::data_type(s.data_type).ok_or_else(|| {
                bad(format!(
                    "sequence_batching state '{}': invalid data_type",
                    s.input_name
                ))
            })?;
            if s.dims.iter().any(|&d| d < 0) {
                return Err(bad(format!(
                    "sequence_batching state '{}': dims {:?} must be fixed (Trident does not grow state)",
                    s.input_name, s.dims
                )));
            }
            if let Some(init) = s
                .initial_state
                .iter()
                .find(|i| !matches!(i.state_data, Some(initial_state::StateData::ZeroData(true))))
            {
                return Err(bad(format!(
                    "sequence_batching state '{}': initial_state '{}' must be zero_data: true (data_file is not supported)",
                    s.input_name, init.name
                )));
            }
            // The zeros are the state's own type and shape: an initial_state that says
            // otherwise is refused, not ignored.
            if let Some(init) = s
                .initial_state
                .iter()
                .find(|i| i.data_type != s.data_type || i.dims != s.dims)
            {
                return Err(bad(format!(
                    "sequence_batching state '{}': initial_state '{}' must have the state's data_type and dims {:?}",
                    s.input_name, init.name, s.dims
                )));
            }
            states.push(StateSpec {
                input: s.input_name.clone(),
                output: s.output_name.clone(),
                dtype,
                dims: s.dims.clone(),
            });
        }
        let idle = match sb.max_sequence_idle_microseconds {
            0 => DEFAULT_IDLE,
            us => Duration::from_micros(us),
        };
        use pb::model_sequence_batching::StrategyChoice;
        let capacity = match &sb.strategy_choice {
            Some(StrategyChoice::Oldest(o)) if o.max_candidate_sequences < 0 => {
                return Err(bad(format!(
                    "sequence_batching.oldest.max_candidate_sequences must not be negative, got {}",
                    o.max_candidate_sequences
                )))
            }
            Some(StrategyChoice::Oldest(o)) => {
                (o.max_candidate_sequences > 0).then_some(o.max_candidate_sequences as usize)
            }
            Some(StrategyChoice::Direct(_)) | None => {
                Some(config.max_batch_size.max(1) as usize * instances.max(1))
            }
        };
        Ok(Some(Sequencer {
            model: config.name.clone(),
            batching: config.max_batch_size > 0,
            idle,
            controls,
            states,
            active: Mutex::new(HashMap::new()),
            capacity,
            tickets: Default::default(),
            freed: tokio::sync::Notify::new(),
        }))
    }

    /// The sequence's slot, checking START and idleness. Requests of one sequence then
    /// serialise on the slot's lock, in the order they reach it.
    pub fn enter(
        &self,
        flags: Option<&SequenceFlags>,
    ) -> Result<Arc<tokio::sync::Mutex<Active>>, ServeError> {
        let flags = flags.ok_or_else(|| {
            ServeError::InvalidRequest(format!(
                "inference request to model '{}' must specify a non-zero or non-empty correlation ID",
                self.model
            ))
        })?;
        let now = Instant::now();
        let mut active = self.active.lock().expect("lock");
        self.release_idle(&mut active, now);
        if flags.start {
            if active.contains_key(&flags.id) {
                tracing::warn!(
                    "sequence {} for model '{}' has a conflict. The previous sequence did not end before this sequence start. Previous sequence will be terminated early.",
                    flags.id,
                    self.model
                );
            }
            let slot = Arc::new(tokio::sync::Mutex::new(Active { state: Vec::new() }));
            let ticket = self.tickets.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
            let replaced = active.insert(
                flags.id.clone(),
                Entry {
                    slot: slot.clone(),
                    last_used: now,
                    waiting: Some(ticket),
                },
            );
            if replaced.is_some() {
                // A slot freed, or a waiter replaced: either may now go on.
                self.freed.notify_waiters();
            }
            return Ok(slot);
        }
        match active.get_mut(&flags.id) {
            Some(e) => {
                e.last_used = now;
                Ok(e.slot.clone())
            }
            None => Err(ServeError::InvalidRequest(format!(
                "inference request for sequence {} to model '{}' must specify the START flag on the first request of the sequence",
                flags.id, self.model
            ))),
        }
    }

    /// Releases sequences idle for longer than the idle time and not in use (also keeps
    /// the map from growing with abandoned IDs).
    fn release_idle(&self, active: &mut HashMap<CorrelationId, Entry>, now: Instant) {
        let before = active.len();
        active.retain(|id, e| {
            let in_use = Arc::strong_count(&e.slot) > 1;
            // A backlog entry whose START request is gone (cancelled) holds nothing.
            let keep = in_use || (e.waiting.is_none() && now.duration_since(e.last_used) <= self.idle);
            if !keep {
                tracing::info!(model = %self.model, sequence = %id, "sequence idle for longer than max_sequence_idle_microseconds: released");
            }
            keep
        });
        if active.len() < before {
            self.freed.notify_waiters();
        }
    }

    /// Waits, holding the sequence's slot, until the sequence is active: at once when a
    /// place is free, else in backlog order as active sequences end or idle out.
    pub async fn admit(&self, flags: &SequenceFlags, slot: &Arc<tokio::sync::Mutex<Active>>) {
        let mut logged = false;
        loop {
            let freed = self.freed.notified();
            tokio::pin!(freed);
            freed.as_mut().enable();
            {
                let mut active = self.active.lock().expect("lock");
                self.release_idle(&mut active, Instant::now());
                let Some(ticket) = (match active.get(&flags.id) {
                    Some(e) if Arc::ptr_eq(&e.slot, slot) => e.waiting,
                    // Replaced by a new START of the same ID: run as Triton runs a
                    // request of a terminated sequence, without waiting.
                    _ => None,
                }) else {
                    return;
                };
                let running = active.values().filter(|e| e.waiting.is_none()).count();
                let first = active.values().filter_map(|e| e.waiting).min() == Some(ticket);
                if first && self.capacity.is_none_or(|c| running < c) {
                    let e = active.get_mut(&flags.id).expect("present");
                    e.waiting = None;
                    e.last_used = Instant::now();
                    // The next in the backlog may fit too.
                    self.freed.notify_waiters();
                    return;
                }
                if !logged {
                    logged = true;
                    tracing::debug!(model = %self.model, sequence = %flags.id, "all {running} sequence slots are taken: the sequence waits in the backlog");
                }
            }
            // Idle sequences are released only when looked at: look again within the
            // idle time even when nothing ends.
            let _ = tokio::time::timeout(self.idle, freed).await;
        }
    }

    /// After a request of the sequence (see [`Leave`]): END releases it; otherwise its
    /// idle clock restarts.
    pub fn leave(&self, flags: &SequenceFlags, slot: &Arc<tokio::sync::Mutex<Active>>) {
        let mut active = self.active.lock().expect("lock");
        match active.get_mut(&flags.id) {
            // A START of the same ID may have replaced this sequence meanwhile.
            Some(e) if Arc::ptr_eq(&e.slot, slot) => {
                // END releases the slot; so does a START that leaves still in the backlog
                // (cancelled before it ran), which would otherwise hold the backlog's head.
                if flags.end || e.waiting.is_some() {
                    active.remove(&flags.id);
                    self.freed.notify_waiters();
                } else {
                    e.last_used = Instant::now();
                }
            }
            _ => {}
        }
    }

    /// The control and state tensors of one request (one row).
    pub fn extra_inputs(
        &self,
        flags: &SequenceFlags,
        active: &Active,
    ) -> Result<Vec<(String, Tensor)>, ServeError> {
        let row = |dims: &[i64]| -> Vec<i64> {
            self.batching
                .then_some(1)
                .into_iter()
                .chain(dims.iter().copied())
                .collect()
        };
        let invalid = |m: String| ServeError::InvalidRequest(m);
        let mut out = Vec::with_capacity(self.controls.len() + self.states.len());
        for c in &self.controls {
            let tensor = match c.kind {
                Kind::ControlSequenceStart => flag(c, flags.start, row(&[1])),
                Kind::ControlSequenceEnd => flag(c, flags.end, row(&[1])),
                // Every row of a batch Trident runs holds a request.
                Kind::ControlSequenceReady => flag(c, true, row(&[1])),
                Kind::ControlSequenceCorrid => corrid(c, &flags.id, row(&[1])).map_err(|m| {
                    invalid(format!("model '{}': control input '{}': {m}", self.model, c.name))
                })?,
            };
            out.push((c.name.clone(), tensor));
        }
        for (i, s) in self.states.iter().enumerate() {
            let tensor = match active.state.get(i) {
                Some(t) => t.clone(),
                None => zeros(s.dtype, row(&s.dims)),
            };
            out.push((s.input.clone(), tensor));
        }
        Ok(out)
    }

    /// Keeps the state outputs of an execution as the sequence's next state; returns
    /// the remaining (client) outputs.
    pub fn keep_state(
        &self,
        active: &mut Active,
        mut outputs: Vec<(String, Tensor)>,
    ) -> Result<Vec<(String, Tensor)>, ServeError> {
        let mut state = Vec::with_capacity(self.states.len());
        for s in &self.states {
            let pos = outputs.iter().position(|(n, _)| *n == s.output).ok_or_else(|| {
                ServeError::Backend(format!("the model did not produce state output '{}'", s.output))
            })?;
            state.push(outputs.swap_remove(pos).1);
        }
        active.state = state;
        Ok(outputs)
    }
}

/// Leaves the sequence when dropped, so that a request leaves it however it ends (a
/// cancelled one included): an END always releases its slot.
pub(crate) struct Leave<'a> {
    pub sequencer: &'a Sequencer,
    pub flags: &'a SequenceFlags,
    pub slot: &'a Arc<tokio::sync::Mutex<Active>>,
}

impl Drop for Leave<'_> {
    fn drop(&mut self) {
        self.sequencer.leave(self.flags, self.slot);
    }
}

fn control_input(name: &str, c: &Control) -> Result<ControlInput, String> {
    let kind =
        Kind::try_from(c.kind).map_err(|_| format!("control_input '{name}': unknown kind {}", c.kind))?;
    if kind == Kind::ControlSequenceCorrid {
        let dtype = config::data_type(c.data_type)
            .ok_or_else(|| format!("control_input '{name}': CORRID needs a data_type"))?;
        if !matches!(
            dtype,
            DataType::U64 | DataType::I64 | DataType::U32 | DataType::I32 | DataType::Bytes
        ) {
            return Err(format!(
                "control_input '{name}': CORRID data_type must be UINT64, INT64, UINT32, INT32 or STRING, got {dtype}"
            ));
        }
        return Ok(ControlInput {
            name: name.to_string(),
            kind,
            dtype,
            values: [Vec::new(), Vec::new()],
        });
    }
    let (dtype, values) = match (
        c.int32_false_true.as_slice(),
        c.fp32_false_true.as_slice(),
        c.bool_false_true.as_slice(),
    ) {
        ([f, t], [], []) => (DataType::I32, [f.to_le_bytes().to_vec(), t.to_le_bytes().to_vec()]),
        ([], [f, t], []) => (DataType::F32, [f.to_le_bytes().to_vec(), t.to_le_bytes().to_vec()]),
        ([], [], [f, t]) => (DataType::Bool, [vec![u8::from(*f)], vec![u8::from(*t)]]),
        _ => {
            return Err(format!(
                "control_input '{name}': give exactly one of int32_false_true, fp32_false_true, bool_false_true, with two values"
            ))
        }
    };
    Ok(ControlInput {
        name: name.to_string(),
        kind,
        dtype,
        values,
    })
}

fn flag(c: &ControlInput, on: bool, shape: Vec<i64>) -> Tensor {
    Tensor::new(c.dtype, shape, c.values[usize::from(on)].clone().into())
        .expect("one element of the control's type")
}

fn corrid(c: &ControlInput, id: &CorrelationId, shape: Vec<i64>) -> Result<Tensor, String> {
    let not_uint = || format!("correlation ID '{id}' does not fit the control's {}", c.dtype);
    let bytes: Vec<u8> = match (c.dtype, id) {
        (DataType::Bytes, id) => {
            return Ok(Tensor::new(
                DataType::Bytes,
                shape,
                trident_core::tensor::encode_bytes_elements([id.to_string()]),
            )
            .expect("one element"))
        }
        (_, CorrelationId::Str(_)) => {
            return Err(format!(
                "correlation ID in request is not an unsigned int ('{id}'; the model's CORRID is {})",
                c.dtype
            ))
        }
        (DataType::U64, CorrelationId::U64(v)) => v.to_le_bytes().to_vec(),
        (DataType::I64, CorrelationId::U64(v)) => {
            i64::try_from(*v).map_err(|_| not_uint())?.to_le_bytes().to_vec()
        }
        (DataType::U32, CorrelationId::U64(v)) => {
            u32::try_from(*v).map_err(|_| not_uint())?.to_le_bytes().to_vec()
        }
        (DataType::I32, CorrelationId::U64(v)) => {
            i32::try_from(*v).map_err(|_| not_uint())?.to_le_bytes().to_vec()
        }
        _ => return Err(not_uint()),
    };
    Ok(Tensor::new(c.dtype, shape, bytes.into()).expect("one element"))
}

fn zeros(dtype: DataType, shape: Vec<i64>) -> Tensor {
    let count: i64 = shape.iter().product();
    let data = match dtype.size() {
        Some(size) => vec![0u8; size * count as usize],
        // Empty strings.
        None => vec![0u8; 4 * count as usize],
    };
    Tensor::new(dtype, shape, data.into()).expect("zeros of the state's shape")
}

#[cfg(test)]
mod tests {
    use super::*;

    fn config(text: &str) -> ModelConfig {
        trident_core::config::parse_config(text, std::path::Path::new("test"))
            .unwrap()
            .config
    }

    const DYNA: &str = r#"
        name: "m" max_batch_size: 8
        sequence_batching {
          max_sequence_idle_microseconds: 5000000
          control_input [
            { name: "START" control [ { kind: CONTROL_SEQUENCE_START fp32_false_true: [ 0, 1 ] } ] },
            { name: "END" control [ { kind: CONTROL_SEQUENCE_END bool_false_true: [ false, true ] } ] },
            { name: "READY" control [ { kind: CONTROL_SEQUENCE_READY int32_false_true: [ 0, 1 ] } ] },
            { name: "CORRID" control [ { kind: CONTROL_SEQUENCE_CORRID data_type: TYPE_UINT64 } ] }
          ]
          state [ { input_name: "S_IN" output_name: "S_OUT" data_type: TYPE_FP32 dims: [ 2 ] } ]
        }
        input [ { name: "X" data_type: TYPE_INT32 dims: [ 1 ] } ]
        output [ { name: "Y" data_type: TYPE_INT32 dims: [ 1 ] } ]"#;

    fn flags(id: u64, start: bool, end: bool) -> SequenceFlags {
        SequenceFlags::new(Some(CorrelationId::U64(id)), start, end)
            .unwrap()
            .unwrap()
    }

    #[test]
    fn controls_take_the_configured_types_and_values() {
        let s = Sequencer::from_config(&config(DYNA), 1).unwrap().unwrap();
        let slot = s.enter(Some(&flags(42, true, false))).unwrap();
        let active = slot.try_lock().unwrap();
        let extra = s.extra_inputs(&flags(42, true, false), &active).unwrap();
        let by = |n: &str| extra.iter().find(|(name, _)| name == n).unwrap().1.clone();
        assert_eq!(by("START").dtype(), DataType::F32);
        assert_eq!(by("START").to_f32().unwrap(), vec![1.0]);
        assert_eq!(by("START").shape(), &[1, 1]);
        assert_eq!(by("END").dtype(), DataType::Bool);
        assert_eq!(&by("END").data()[..], &[0]);
        assert_eq!(&by("READY").data()[..], &1i32.to_le_bytes());
        assert_eq!(&by("CORRID").data()[..], &42u64.to_le_bytes());
        assert_eq!(by("S_IN").shape(), &[1, 2], "state starts as zeros of its dims");
        assert_eq!(by("S_IN").to_f32().unwrap(), vec![0.0, 0.0]);
        let e = s.extra_inputs(
            &SequenceFlags::new(Some(CorrelationId::Str("abc".into())), true, false)
                .unwrap()
                .unwrap(),
            &active,
        );
        assert!(e
            .unwrap_err()
            .to_string()
            .contains("correlation ID in request is not an unsigned int"));
    }

    #[tokio::test]
    async fn state_carries_over_and_end_releases() {
        let s = Sequencer::from_config(&config(DYNA), 1).unwrap().unwrap();
        let err = s.enter(Some(&flags(7, false, false))).unwrap_err().to_string();
        assert!(
            err.contains("must specify the START flag on the first request"),
            "{err}"
        );
        let err = s.enter(None).unwrap_err().to_string();
        assert!(
            err.contains("must specify a non-zero or non-empty correlation ID"),
            "{err}"
        );

        let slot = s.enter(Some(&flags(7, true, false))).unwrap();
        s.admit(&flags(7, true, false), &slot).await;
        {
            let mut active = slot.try_lock().unwrap();
            let out = vec![
                (
                    "Y".to_string(),
                    Tensor::new(DataType::I32, vec![1, 1], vec![0; 4].into()).unwrap(),
                ),
                (
                    "S_OUT".to_string(),
                    Tensor::from_f32(vec![1, 2], &[3.0, 4.0]).unwrap(),
                ),
            ];
            let rest = s.keep_state(&mut active, out).unwrap();
            assert_eq!(rest.len(), 1, "state outputs are not returned to the client");
            assert_eq!(rest[0].0, "Y");
        }
        s.leave(&flags(7, true, false), &slot);
        let again = s.enter(Some(&flags(7, false, true))).unwrap();
        assert!(Arc::ptr_eq(&slot, &again));
        let state = {
            let active = again.try_lock().unwrap();
            let extra = s.extra_inputs(&flags(7, false, true), &active).unwrap();
            extra.into_iter().find(|(n, _)| n == "S_IN").unwrap().1
        };
        assert_eq!(
            state.to_f32().unwrap(),
            vec![3.0, 4.0],
            "the previous request's state output"
        );
        s.leave(&flags(7, false, true), &again);
        assert!(
            s.enter(Some(&flags(7, false, false))).is_err(),
            "END released the sequence"
        );
    }

    #[test]
    fn invalid_configs_and_ids_are_named() {
        let bad = DYNA.replace("fp32_false_true: [ 0, 1 ]", "fp32_false_true: [ 0 ]");
        let err = Sequencer::from_config(&config(&bad), 1).err().unwrap();
        assert_eq!(err.field, "sequence_batching");
        let err = err.to_string();
        assert!(err.contains("control_input 'START'"), "{err}");
        let init = |dims: &str| {
            DYNA.replace(
                "dims: [ 2 ] } ]",
                &format!("dims: [ 2 ] initial_state {{ name: \"z\" data_type: TYPE_FP32 dims: [ {dims} ] zero_data: true }} }} ]"),
            )
        };
        assert!(Sequencer::from_config(&config(&init("2")), 1).is_ok());
        let err = Sequencer::from_config(&config(&init("3")), 1)
            .err()
            .unwrap()
            .to_string();
        assert!(
            err.contains("initial_state 'z' must have the state's data_type and dims"),
            "{err}"
        );
        let long = "x".repeat(MAX_STRING_ID + 1);
        assert_eq!(
            SequenceFlags::new(Some(CorrelationId::Str(long)), true, false),
            Err(FlagsError::IdTooLong {
                len: MAX_STRING_ID + 1,
                max: MAX_STRING_ID
            })
        );
        assert_eq!(
            SequenceFlags::new(Some(CorrelationId::U64(0)), false, false),
            Ok(None)
        );
        assert_eq!(
            SequenceFlags::new(None, true, false),
            Err(FlagsError::MissingId),
            "START without an ID"
        );
    }

    /// One request of a sequence through the sequencer, as `ModelVersion` runs it.
    async fn request(s: &Sequencer, f: SequenceFlags) {
        let slot = s.enter(Some(&f)).unwrap();
        let guard = slot.lock().await;
        s.admit(&f, &slot).await;
        drop(guard);
        s.leave(&f, &slot);
    }

    async fn admitted_within(s: &Sequencer, f: SequenceFlags, ms: u64) -> bool {
        tokio::time::timeout(Duration::from_millis(ms), request(s, f))
            .await
            .is_ok()
    }

    #[tokio::test]
    async fn sequences_beyond_the_slots_wait_in_order_until_one_ends_or_idles_out() {
        // Oldest with two candidates: a third sequence waits for one of them to end.
        let oldest = DYNA.replace(
            "max_sequence_idle_microseconds: 5000000",
            "max_sequence_idle_microseconds: 300000\n oldest { max_candidate_sequences: 2 }",
        );
        let s = Arc::new(Sequencer::from_config(&config(&oldest), 1).unwrap().unwrap());
        assert_eq!(s.capacity, Some(2));
        assert!(admitted_within(&s, flags(1, true, false), 50).await);
        assert!(admitted_within(&s, flags(2, true, false), 50).await);
        let (s3, s4) = (s.clone(), s.clone());
        let third = tokio::spawn(async move { request(&s3, flags(3, true, false)).await });
        tokio::time::sleep(Duration::from_millis(20)).await;
        let fourth = tokio::spawn(async move { request(&s4, flags(4, true, false)).await });
        tokio::time::sleep(Duration::from_millis(50)).await;
        assert!(
            !third.is_finished() && !fourth.is_finished(),
            "both wait in the backlog"
        );
        // A later request of an active sequence still runs.
        assert!(admitted_within(&s, flags(1, false, false), 50).await);
        // Sequence 2 ends: the first in the backlog (3) becomes active, not 4.
        assert!(admitted_within(&s, flags(2, false, true), 50).await);
        tokio::time::timeout(Duration::from_millis(100), third)
            .await
            .unwrap()
            .unwrap();
        tokio::time::sleep(Duration::from_millis(20)).await;
        assert!(!fourth.is_finished());
        // Nothing ends; sequence 1 (and 3) go idle past 300 ms and are released, which
        // makes room for 4.
        tokio::time::timeout(Duration::from_millis(1500), fourth)
            .await
            .unwrap()
            .unwrap();

        // Direct (the default): max_batch_size slots per instance.
        let direct = DYNA.replace("max_batch_size: 8", "max_batch_size: 2");
        let s = Sequencer::from_config(&config(&direct), 2).unwrap().unwrap();
        assert_eq!(s.capacity, Some(4));
        // Oldest without max_candidate_sequences: no limit; a negative one is refused.
        let unlimited = DYNA.replace("max_sequence_idle_microseconds: 5000000", "oldest { }");
        assert_eq!(
            Sequencer::from_config(&config(&unlimited), 1)
                .unwrap()
                .unwrap()
                .capacity,
            None
        );
        let negative = DYNA.replace(
            "max_sequence_idle_microseconds: 5000000",
            "oldest { max_candidate_sequences: -1 }",
        );
        let err = Sequencer::from_config(&config(&negative), 1)
            .err()
            .unwrap()
            .to_string();
        assert!(err.contains("max_candidate_sequences"), "{err}");
    }

    #[tokio::test]
    async fn a_start_cancelled_in_the_backlog_does_not_hold_its_head() {
        // One candidate and a long idle time: only the cancellation can free the way.
        let oldest = DYNA.replace(
            "max_sequence_idle_microseconds: 5000000",
            "max_sequence_idle_microseconds: 5000000\n oldest { max_candidate_sequences: 1 }",
        );
        let s = Arc::new(Sequencer::from_config(&config(&oldest), 1).unwrap().unwrap());
        assert!(admitted_within(&s, flags(1, true, false), 50).await);
        let s2 = s.clone();
        let cancelled = tokio::spawn(async move { request(&s2, flags(2, true, false)).await });
        tokio::time::sleep(Duration::from_millis(20)).await;
        let s3 = s.clone();
        let next = tokio::spawn(async move { request(&s3, flags(3, true, false)).await });
        tokio::time::sleep(Duration::from_millis(20)).await;
        cancelled.abort();
        assert!(cancelled.await.unwrap_err().is_cancelled());
        // Sequence 1 ends: 3 is next, though 2 arrived first and never ran.
        assert!(admitted_within(&s, flags(1, false, true), 50).await);
        tokio::time::timeout(Duration::from_millis(200), next)
            .await
            .unwrap()
            .unwrap();
        // Sequence 2 left no trace: its next request needs a START.
        assert!(matches!(
            s.enter(Some(&flags(2, false, false))),
            Err(ServeError::InvalidRequest(_))
        ));
    }

    #[test]
    fn control_and_state_tensors_are_not_client_tensors() {
        let dyna = config(DYNA);
        let (inputs, outputs) = hidden_tensors(&dyna);
        assert_eq!(inputs, ["START", "END", "READY", "CORRID", "S_IN"]);
        assert_eq!(outputs, ["S_OUT"]);
        let clash = DYNA.replace(
            r#"input [ { name: "X""#,
            r#"input [ { name: "READY" data_type: TYPE_INT32 dims: [ 1 ] }, { name: "X""#,
        );
        let err = Sequencer::from_config(&config(&clash), 1)
            .err()
            .unwrap()
            .to_string();
        assert!(err.contains("supplies input 'READY'"), "{err}");
        let clash = DYNA.replace(
            r#"output [ { name: "Y""#,
            r#"output [ { name: "S_OUT" data_type: TYPE_FP32 dims: [ 2 ] }, { name: "Y""#,
        );
        let err = Sequencer::from_config(&config(&clash), 1)
            .err()
            .unwrap()
            .to_string();
        assert!(err.contains("keeps output 'S_OUT'"), "{err}");
    }
}
