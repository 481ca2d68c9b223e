"""Built-in catalog providers: language and image models (OpenAI, Anthropic).

Shows the two metered price forms and the tier-4 guards that keep them honest:

* ``usage`` prices (chat, embeddings, messages): reserved at ``estimate_micro``, settled from the token
  counts in the answer's ``usage`` object. The rates are one model's, so that model is pinned with a
  single-valued ``enum`` on ``model``: on treg's own key (the platform tier) a body asking for another
  model is refused before anything is spent; on a team's own key the body is relayed untouched.
  ``stream`` is pinned to false the same way, since a streamed answer carries no usage to settle from.
* a ``table`` price (image generation): a flat price per image chosen by the body's ``size``.
* a retired endpoint with a successor: OpenAI shut its Edits API down on 2024-01-04 and pointed users
  at chat completions; a call is refused with 410, ``status_note`` and ``superseded_by``.

Rates are the providers' published list prices when written (gpt-4o-mini $0.15/$0.60 per million
tokens, text-embedding-3-small $0.02, dall-e-3 standard $0.04/$0.08 per image, Claude Haiku 4.5
$1/$5), in micro-USD per token or per call; check them before reselling.
"""

from __future__ import annotations

from treg import hookimpl

_BEARER = [{"location": "header", "name": "Authorization", "format": "Bearer {secret}"}]
_NO_STREAM = {"name": "stream", "in": "body", "type": "boolean", "enum": [False],
              "description": "streaming answers carry no usage to settle from: false only on treg's key"}

OPENAI = {
    "id": "openai",
    "name": "OpenAI API",
    "description": "OpenAI's chat, embeddings and image models.",
    "docs_url": "https://platform.openai.com/docs/api-reference",
    "base_url": "https://api.openai.com/v1",
    "auth": _BEARER,
    "endpoints": [
        {
            "id": "openai.chat.completions.create",
            "method": "POST",
            "path": "/chat/completions",
            "description": "A chat completion from gpt-4o-mini.",
            "docs_url": "https://platform.openai.com/docs/api-reference/chat/create",
            "params": [
                {"name": "model", "in": "body", "required": True, "enum": ["gpt-4o-mini"]},
                {"name": "messages", "in": "body", "required": True, "type": "array", "min_items": 1},
                _NO_STREAM,
            ],
            "price": {"usage": [{"path": "usage.prompt_tokens", "micro_per_unit": 0.15},
                                {"path": "usage.completion_tokens", "micro_per_unit": 0.6}],
                      "estimate_micro": 20000},
            "capability": "llm.chat",
        },
        {
            "id": "openai.embeddings.create",
            "method": "POST",
            "path": "/embeddings",
            "description": "Embeddings from text-embedding-3-small.",
            "docs_url": "https://platform.openai.com/docs/api-reference/embeddings/create",
            "params": [
                {"name": "model", "in": "body", "required": True, "enum": ["text-embedding-3-small"]},
                {"name": "input", "in": "body", "required": True},
            ],
            "price": {"usage": [{"path": "usage.prompt_tokens", "micro_per_unit": 0.02}], "estimate_micro": 2000},
            "capability": "text.embedding",
        },
        {
            "id": "openai.images.generate",
            "method": "POST",
            "path": "/images/generations",
            "description": "One dall-e-3 image (standard quality); the size chooses the price.",
            "docs_url": "https://platform.openai.com/docs/api-reference/images/create",
            "params": [
                {"name": "model", "in": "body", "required": True, "enum": ["dall-e-3"]},
                {"name": "prompt", "in": "body", "required": True, "type": "string"},
                {"name": "size", "in": "body", "required": True, "enum": ["1024x1024", "1024x1792", "1792x1024"]},
                {"name": "quality", "in": "body", "enum": ["standard"]},
                {"name": "n", "in": "body", "enum": [1]},
                {"name": "response_format", "in": "body", "enum": ["url", "b64_json"]},
                {"name": "style", "in": "body", "enum": ["vivid", "natural"]},
                {"name": "user", "in": "body", "type": "string"},
            ],
            "price": {"table": {"field": "size",
                                "prices": {"1024x1024": 40000, "1024x1792": 80000, "1792x1024": 80000}}},
            "capability": "image.generate",
            "body_allowlist": True,
        },
        {
            "id": "openai.models.list",
            "method": "GET",
            "path": "/models",
            "description": "The models the key may use.",
            "docs_url": "https://platform.openai.com/docs/api-reference/models/list",
            "params": [],
            "price": {"per_call_micro": 0},
            "strict_query": True,
        },
        {
            "id": "openai.edits.create",
            "method": "POST",
            "path": "/edits",
            "description": "The former Edits API (text-davinci-edit-001).",
            "docs_url": "https://platform.openai.com/docs/deprecations",
            "params": [],
            "price": {"per_call_micro": 0},
            "status": "retired",
            "status_note": "OpenAI shut the Edits API down on 2024-01-04; chat completions replace it",
            "superseded_by": "openai.chat.completions.create",
        },
    ],
}

ANTHROPIC = {
    "id": "anthropic",
    "name": "Anthropic API",
    "description": "Claude models through the Messages API.",
    "docs_url": "https://docs.anthropic.com/en/api/messages",
    "base_url": "https://api.anthropic.com/v1",
    "auth": [{"location": "header", "name": "x-api-key"}],
    "required_headers": {"anthropic-version": "2023-06-01"},
    "endpoints": [
        {
            "id": "anthropic.messages.create",
            "method": "POST",
            "path": "/messages",
            "description": "A message from Claude Haiku 4.5.",
            "docs_url": "https://docs.anthropic.com/en/api/messages",
            "params": [
                {"name": "model", "in": "body", "required": True, "enum": ["claude-haiku-4-5-20251001"]},
                {"name": "max_tokens", "in": "body", "required": True, "type": "integer"},
                {"name": "messages", "in": "body", "required": True, "type": "array", "min_items": 1},
                _NO_STREAM,
            ],
            "price": {"usage": [{"path": "usage.input_tokens", "micro_per_unit": 1},
                                {"path": "usage.output_tokens", "micro_per_unit": 5}],
                      "estimate_micro": 20000},
            "capability": "llm.chat",
        },
        {
            "id": "anthropic.models.list",
            "method": "GET",
            "path": "/models",
            "description": "The models the key may use.",
            "docs_url": "https://docs.anthropic.com/en/api/models-list",
            "params": [
                {"name": "limit", "in": "query", "type": "integer"},
                {"name": "before_id", "in": "query"},
                {"name": "after_id", "in": "query"},
            ],
            "price": {"per_call_micro": 0},
            "strict_query": True,
        },
    ],
}


@hookimpl
def treg_register_providers():
    return [OPENAI, ANTHROPIC]
