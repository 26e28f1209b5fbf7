//! The codec's bounds at their edges, through the public API only (kills cargo-mutants
//! survivors in protocol/src/codec.rs): the size limit is inclusive, the traversal budget grows
//! with the message (a large honest batch decodes), and a mapping that ends before it starts is
//! refused by name.

use ember_protocol::{
    decode_sampler_message, encode_sampler_message, Batch, DecodeError, Limits, Mapping,
    ProcessInfo, Row, SamplerMessage, StackRef,
};

/// A batch of one row whose user stack has `frames` frames.
fn batch_with_stack(frames: usize) -> SamplerMessage {
    SamplerMessage::Batch(Batch {
        sequence: 3,
        part: 0,
        parts: 1,
        interval_start_unix_ns: 1,
        interval_end_unix_ns: 2,
        frequency_hz: 99,
        user_stacks: vec![(0..frames as u64).map(|i| 0x40_0000 + i).collect()],
        rows: vec![Row {
            pid: 7,
            tid: 7,
            comm: "work".to_owned(),
            user_stack: StackRef::Index(0),
            kernel_stack: StackRef::Missing(14),
            count: 5,
            interp_stack: None,
            off_cpu_ns: 0,
        }],
        ..Batch::default()
    })
}

#[test]
fn a_message_exactly_at_the_size_limit_is_accepted_one_byte_over_is_not() {
    let message = batch_with_stack(10);
    let bytes = encode_sampler_message(&message);
    let at_limit = Limits {
        max_message_bytes: bytes.len(),
    };
    assert_eq!(
        decode_sampler_message(&bytes, &at_limit).expect("a message of exactly the limit"),
        message
    );
    let below = Limits {
        max_message_bytes: bytes.len() - 1,
    };
    match decode_sampler_message(&bytes, &below) {
        Err(DecodeError::TooLarge { len, limit }) => {
            assert_eq!((len, limit), (bytes.len(), bytes.len() - 1));
        }
        other => panic!("a message one byte over the limit gave {other:?}"),
    }
}

#[test]
fn the_traversal_budget_grows_with_the_message() {
    // Given an honest batch of 100,000 frames (~800 KB): reading it visits every word once,
    // far beyond a fixed budget of a few thousand words
    let message = batch_with_stack(100_000);
    let bytes = encode_sampler_message(&message);
    assert!(bytes.len() > 800_000, "{} bytes", bytes.len());
    // When decoded within a 4 MiB size limit
    let limits = Limits {
        max_message_bytes: 4 << 20,
    };
    // Then it decodes whole: the budget is derived from its size, not a constant
    assert_eq!(
        decode_sampler_message(&bytes, &limits).expect("an honest large batch"),
        message
    );
}

#[test]
fn a_mapping_that_ends_before_it_starts_is_refused_by_name() {
    let process = |start: u64, end: u64| {
        SamplerMessage::Process(ProcessInfo {
            pid: 42,
            executable_name: "work".to_owned(),
            mappings: vec![Mapping {
                start,
                end,
                path: "/usr/bin/work".to_owned(),
                ..Mapping::default()
            }],
            ..ProcessInfo::default()
        })
    };
    let limits = Limits {
        max_message_bytes: 1 << 20,
    };
    let good = process(0x40_0000, 0x40_1000);
    assert_eq!(
        decode_sampler_message(&encode_sampler_message(&good), &limits).expect("a valid mapping"),
        good
    );
    match decode_sampler_message(
        &encode_sampler_message(&process(0x40_1000, 0x40_0000)),
        &limits,
    ) {
        Err(DecodeError::Invalid { field, .. }) => assert_eq!(field, "mapping.end"),
        other => panic!("a mapping ending before its start gave {other:?}"),
    }
}
