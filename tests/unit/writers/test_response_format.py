"""Which answers of a model server are a refusal of the response_format, and which are not."""

from __future__ import annotations

import pytest

from app.writers.transport import FORMAT_REFUSAL


@pytest.mark.parametrize(
    "body",
    [
        # OpenAI, a model without structured outputs
        '{"error": {"message": "Invalid parameter: \'response_format\' of type \'json_schema\' is not '
        'supported with this model.", "type": "invalid_request_error", "param": "response_format", '
        '"code": null}}',
        # OpenAI, json_object without the word JSON in the prompt
        '{"error": {"message": "\'messages\' must contain the word \'json\' in some form, to use '
        '\'response_format\' of type \'json_object\'.", "type": "invalid_request_error", '
        '"param": "messages", "code": null}}',
        # llama.cpp's server (400; older builds answer it with 500)
        '{"error": {"code": 500, "message": "response_format type must be one of \\"text\\" or '
        '\\"json_object\\", but got: json_schema", "type": "server_error"}}',
        # llama-cpp-python (HTTP 500), and vLLM before it took json_schema (400)
        '{"error": {"message": "1 validation error for CreateChatCompletionRequest\\nresponse_format.type'
        "\\n  Input should be 'text' or 'json_object' [type=literal_error, input_value='json_schema', "
        'input_type=str]", "type": "internal_server_error"}}',
        # vLLM, a schema its structured-output backend cannot compile
        '{"object": "error", "message": "The provided JSON schema contains features not supported by '
        'xgrammar.", "type": "BadRequestError", "param": null, "code": 400}',
        "response_format is not supported",
    ],
)
def test_refusals_of_the_response_format_are_recognised(body: str) -> None:
    assert FORMAT_REFUSAL.search(body)


@pytest.mark.parametrize(
    "body",
    [
        # vLLM, the prompt is too long
        '{"object": "error", "message": "This model\'s maximum context length is 4096 tokens. However, you '
        "requested 5120 tokens (1024 in the messages, 4096 in the completion). Please reduce the length of "
        'the messages or completion.", "type": "BadRequestError", "param": null, "code": 400}',
        # OpenAI, the same
        '{"error": {"message": "This model\'s maximum context length is 8192 tokens.", '
        '"type": "invalid_request_error", "param": "messages", "code": "context_length_exceeded"}}',
        # llama.cpp's server, the same
        '{"error": {"code": 400, "message": "the request exceeds the available context size, try increasing '
        'it", "type": "exceed_context_size_error", "n_prompt_tokens": 9000, "n_ctx": 8192}}',
        # a validation error that echoes the request, response_format and all
        '{"detail": [{"type": "missing", "loc": ["body", "model"], "msg": "Field required", '
        '"input": {"messages": [], "response_format": {"type": "json_schema", '
        '"json_schema": {"name": "extract", "schema": {}}}}}]}',
    ],
)
def test_other_refusals_are_not_taken_for_a_response_format_refusal(body: str) -> None:
    assert not FORMAT_REFUSAL.search(body)
