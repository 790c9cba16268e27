import pytest

from pdserve.v1 import generation_pb2 as pb

EXPECTED_FIELDS = {
    "GenerateRequest": {
        "request_id": 1, "text": 2, "token_ids": 3, "messages": 4, "sampling": 5, "priority": 6, "n": 7,
        "best_of": 8, "resume_from_token": 9, "prior_token_ids": 10,
    },
    "TokenIds": {"ids": 1},
    "ChatMessages": {"messages": 1},
    "ChatMessage": {"role": 1, "content": 2},
    "SamplingParams": {
        "max_tokens": 1, "temperature": 2, "top_p": 3, "top_k": 4, "min_p": 5, "seed": 6,
        "stop": 7, "stop_token_ids": 8, "ignore_eos": 9, "logprobs": 10, "presence_penalty": 11,
        "frequency_penalty": 12, "repetition_penalty": 13, "logit_bias": 14, "min_tokens": 15,
        "structured_output": 16, "prompt_logprobs": 17,
    },
    "StructuredOutput": {"json_schema": 1, "json_object": 2, "regex": 3, "grammar": 4, "choice": 5},
    "Choices": {"choices": 1},
    "GenerateResponse": {
        "request_id": 1, "token_ids": 2, "text": 3, "finish_reason": 4, "usage": 5, "logprobs": 6, "index": 7,
        "prompt_logprobs": 8,
    },
    "TopLogprob": {"token_id": 1, "logprob": 2},
    "TokenLogprobs": {"token_id": 1, "logprob": 2, "top": 3},
    "Usage": {"prompt_tokens": 1, "cached_tokens": 2, "completion_tokens": 3, "preemptions": 4,
              "recompute_preemptions": 5, "swap_preemptions": 6, "kv_transfer_bytes": 7, "decode_cached_tokens": 8,
              "local_prefill": 9},
    "AbortRequest": {"request_id": 1},
    "AbortResponse": {"found": 1, "outcome": 2},
}

OPTIONAL_SAMPLING = ("max_tokens", "temperature", "top_p", "top_k", "min_p", "seed", "logprobs")


@pytest.mark.parametrize("message_name", sorted(EXPECTED_FIELDS))
def test_field_names_and_numbers(message_name):
    descriptor = pb.DESCRIPTOR.message_types_by_name[message_name]
    numbers = {field.name: field.number for field in descriptor.fields}
    assert numbers == EXPECTED_FIELDS[message_name]


def test_package_and_service_shape():
    assert pb.DESCRIPTOR.package == "pdserve.v1"
    service = pb.DESCRIPTOR.services_by_name["Generation"]
    generate, abort = service.methods_by_name["Generate"], service.methods_by_name["Abort"]
    assert generate.server_streaming and not generate.client_streaming
    assert generate.input_type.name == "GenerateRequest"
    assert generate.output_type.name == "GenerateResponse"
    assert not abort.server_streaming
    assert (abort.input_type.name, abort.output_type.name) == ("AbortRequest", "AbortResponse")


def test_enum_values():
    assert dict(pb.Priority.items()) == {
        "PRIORITY_UNSPECIFIED": 0, "PRIORITY_VIP": 1, "PRIORITY_NORMAL": 2, "PRIORITY_BATCH": 3,
    }
    assert dict(pb.FinishReason.items()) == {
        "FINISH_REASON_UNSPECIFIED": 0,
        "FINISH_REASON_LENGTH": 1,
        "FINISH_REASON_STOP": 2,
        "FINISH_REASON_ABORT": 3,
    }
    assert dict(pb.AbortOutcome.items()) == {
        "ABORT_OUTCOME_UNSPECIFIED": 0, "ABORT_OUTCOME_ABORTED": 1, "ABORT_OUTCOME_PENDING": 2,
        "ABORT_OUTCOME_ENDED": 3,
    }


@pytest.mark.parametrize("name", OPTIONAL_SAMPLING)
def test_optional_sampling_fields_track_presence(name):
    params = pb.SamplingParams()
    assert not params.HasField(name)
    setattr(params, name, 0)
    assert params.HasField(name)
    parsed = pb.SamplingParams.FromString(params.SerializeToString())
    assert parsed.HasField(name) and getattr(parsed, name) == 0
    parsed.ClearField(name)
    assert not parsed.HasField(name)


def test_repeated_and_plain_fields_have_no_presence():
    params = pb.SamplingParams(ignore_eos=True)
    with pytest.raises(ValueError):
        params.HasField("stop")
    with pytest.raises(ValueError):
        params.HasField("ignore_eos")


def test_prompt_oneof_keeps_the_last_form_set():
    request = pb.GenerateRequest(text="hello")
    assert request.WhichOneof("prompt") == "text"
    request.token_ids.ids.extend([1, 2, 3])
    assert request.WhichOneof("prompt") == "token_ids"
    assert request.text == ""
    request.messages.messages.add(role="user", content="hi")
    assert request.WhichOneof("prompt") == "messages"
    assert not request.HasField("token_ids")


def test_generate_request_round_trip():
    request = pb.GenerateRequest(
        request_id="r-1",
        messages=pb.ChatMessages(messages=[pb.ChatMessage(role="user", content="Bonjour é")]),
        sampling=pb.SamplingParams(
            max_tokens=32, temperature=0.0, top_k=40, seed=2**63 + 5,
            stop=["\n\n"], stop_token_ids=[2], ignore_eos=True,
        ),
        priority=pb.PRIORITY_VIP,
    )
    parsed = pb.GenerateRequest.FromString(request.SerializeToString())
    assert parsed == request
    assert parsed.messages.messages[0].content == "Bonjour é"
    assert parsed.sampling.seed == 2**63 + 5
    assert parsed.sampling.HasField("temperature") and parsed.sampling.temperature == 0.0
    assert not parsed.sampling.HasField("top_p")


def test_generate_response_round_trip_with_final_fields():
    last = pb.GenerateResponse(
        request_id="r-1",
        token_ids=[17, 2],
        text=" Paris.",
        finish_reason=pb.FINISH_REASON_STOP,
        usage=pb.Usage(prompt_tokens=37, cached_tokens=32, completion_tokens=8, preemptions=1),
    )
    parsed = pb.GenerateResponse.FromString(last.SerializeToString())
    assert parsed == last
    assert list(parsed.token_ids) == [17, 2]
    assert parsed.HasField("usage") and parsed.usage.cached_tokens == 32
    middle = pb.GenerateResponse.FromString(pb.GenerateResponse(token_ids=[5]).SerializeToString())
    assert middle.finish_reason == pb.FINISH_REASON_UNSPECIFIED
    assert not middle.HasField("usage")


def test_unspecified_priority_is_the_default():
    assert pb.GenerateRequest().priority == pb.PRIORITY_UNSPECIFIED
    assert pb.AbortResponse().found is False
