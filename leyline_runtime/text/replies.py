"""An assistant reply from the tokens the engine generated: its message, the tokens a session
keeps for it, and its logprobs in OpenAI's shape."""

from __future__ import annotations

import codecs

from leyline_sdk.protocol import Message, TokenLogprob, TopLogprob

from leyline_runtime.text import chat_template as tpl
from leyline_runtime.text.tokenizer import ChatTokenizer


def reply_message(tokenizer: ChatTokenizer, generated: list[int],
                  stop_string: str | None) -> tuple[Message, list[int]]:
    """(the message, its tokens from the assistant header on) for ``generated`` (an end marker last
    when the model ended the message; ``stop_string``: the stop string that ended it, if one did)."""
    header = tokenizer.role_ids["assistant"]
    ended = bool(generated) and generated[-1] == tokenizer.end_id and stop_string is None
    body_ids = generated[:-1] if ended else generated
    # call ids are random, so they stay unique in a thread whose session is rebuilt
    parsed = tpl.parse_assistant_tokens(body_ids, tokenizer.decode, tokenizer.tool_call_id,
                                        tokenizer.end_tool_call_id, stop=stop_string)
    message = Message(role="assistant", content=parsed.content, tool_calls=parsed.tool_calls or None)
    if ended and not parsed.malformed:
        return message, [header, *generated]  # generated tokens are canonical
    return message, tokenizer.encode_message(message)


def content_logprobs(tokenizer: ChatTokenizer, generated: list[int],
                     logprobs: list[tuple[float, list[tuple[int, float]]]], content: str) -> list[TokenLogprob]:
    """One entry per token of ``content``, as at OpenAI: their texts join to it, their bytes to its UTF-8.

    ``logprobs``: per generated token, its logprob and the top ones. Markup (tool calls, the end
    marker) is not content and has no entry; a token that runs past a stop string is cut where
    the content ends. A token holding only part of a character has the text "" and its bytes;
    the token that completes the character carries it.
    """
    wanted = content.encode("utf-8")
    text = codecs.getincrementaldecoder("utf-8")()
    out, done, in_call = [], 0, False
    for tok, (lp, tops) in zip(generated, logprobs):
        if tok in (tokenizer.tool_call_id, tokenizer.end_tool_call_id):
            in_call = tok == tokenizer.tool_call_id
        if in_call or tok in tokenizer.control_ids:
            continue
        raw = tokenizer.token_bytes(tok)[:len(wanted) - done]
        if not raw or wanted[done:done + len(raw)] != raw:
            break  # the content ended (a stop string), or it is not these tokens' bytes
        done += len(raw)
        out.append(TokenLogprob(
            token=text.decode(raw, final=done == len(wanted)), logprob=lp, bytes=list(raw),
            top_logprobs=[TopLogprob(token=tokenizer.token_text(t), logprob=v, bytes=list(tokenizer.token_bytes(t)))
                          for t, v in tops]))
    return out
