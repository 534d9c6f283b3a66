"""The memory as MCP tools (the official ``mcp`` SDK's ``MCPServer``, formerly ``FastMCP``).

Ten tools over :mod:`retrieval.service.operations`, the same code as the HTTP routes, with the
same argument schemas and limits, as strictly typed (``limit: "5"`` is refused). Where they differ:
``memory_consolidate`` answers the whole job (HTTP: 202 with its ``job_id``), as a tool call has no
status code to say it was accepted. The user is never
an argument: ``user_of`` gives it from the call's context (the server's ``--user`` over stdio,
the request's key over HTTP). Over a read-only memory only the tools that read are listed (a call
of a write tool is refused 403, as over HTTP). An unknown tool is the tool's error naming ``name``
(404); an unexpected failure inside a tool is logged once with a request id, and its error says
only that id: ``{"error", "request_id", "status": 500}``.
"""

from __future__ import annotations

import types
from collections.abc import Callable
from importlib import metadata
from typing import TYPE_CHECKING, Annotated, Any, Union, get_args, get_origin

from mcp.server.mcpserver import Context, MCPServer
from mcp.server.mcpserver.exceptions import ToolError
from mcp.server.mcpserver.utilities.func_metadata import FuncMetadata
from mcp.shared.exceptions import MCPError
from mcp.types import INVALID_PARAMS, CallToolResult, TextContent, Tool, ToolAnnotations
from pydantic import Field, ValidationError

from retrieval.api.errors import IngestFailed, MemoryAPIError, ReadOnly
from retrieval.memory import strict_json
from retrieval.memory.errors import StoreError
from retrieval.service import limits, operations, schemas
from retrieval.service.auth import INGEST_FAILED, store_failed
from retrieval.service.drain import ShuttingDown, WriteGate
from retrieval.service.early_refusal import refusal
from retrieval.service.errors import INVALID, internal_error, invalid_status, logged_failure, status_of

if TYPE_CHECKING:  # for types only: the server is handed an open memory, never builds one
    from retrieval.api.memory import Memory

UserOf = Callable[[Context], str]
INSTRUCTIONS = ("Long-term memory of one user. Add dialogue turns as they happen (memory_add), find what was "
                "said before (memory_search), list, get, delete or forget memories, "
                "and consolidate near-duplicates (memory_consolidate, then memory_job).")

READ_ONLY_INSTRUCTIONS = ("Long-term memory of one user, read-only here: find what was said before "
                          "(memory_search), list or get memories, read a consolidation job.")
WRITE_TOOLS = ("memory_add", "memory_flush", "memory_delete", "memory_forget", "memory_consolidate")
"""The tools that write: a read-only memory's server does not list them."""

ADD_DESCRIPTION = ("Add dialogue turns (speaker, text, optional ISO time and turn_id) to a session; "
                   f"searchable at once. Over HTTP a call is at most {limits.MAX_BODY_BYTES:,} bytes of "
                   "JSON, whatever its turns' limits allow: send a long conversation in several calls.")


class Refused(ToolError):
    """A tool's refusal, answered as the tool's error (``is_error``): its text is the message, and
    its structured content says the same as the HTTP route's answer, ``{"error", "field"?,
    "status"}``: the argument named (a tool's argument, as the message begins with it), and the
    HTTP status of the same refusal (:data:`retrieval.service.errors.REFUSAL_STATUS`: 503 is worth
    retrying, the others are not)."""

    def __init__(self, message: str, status: int, argument: str | None = None,
                 request_id: str | None = None) -> None:
        super().__init__(message)
        self.status, self.argument, self.request_id = status, argument, request_id

    def result(self) -> CallToolResult:
        named = {"request_id": self.request_id} if self.request_id is not None else {}
        detail = {**refusal(str(self), self.argument), **named, "status": self.status}
        return CallToolResult(content=[TextContent(type="text", text=str(self))], structured_content=detail,
                              is_error=True)


def _refusals(call: Callable[[], Any], id_argument: str = "memory_id") -> Any:
    """A bad argument or a refusal of the memory becomes the tool's error (:class:`Refused`) naming
    what is wrong, not a crash: ``call`` builds the request schemas too, so their checks are here.
    The memory's ``id`` is the tool's ``id_argument``."""
    try:
        return call()
    except ValidationError as err:
        raise _invalid(err) from None
    except (MemoryAPIError, ShuttingDown, StoreError) as err:
        failed = err if isinstance(err, StoreError) else err.__cause__
        if isinstance(failed, StoreError):  # the store failed under the call: its cause only logged
            status, message = store_failed("under an MCP tool", failed)
            raise Refused(message, status) from None
        if isinstance(err, IngestFailed):  # the worker logged what failed
            raise Refused(INGEST_FAILED, status_of(err)) from None
        field = getattr(err, "field", None)
        if field is not None and field.split(".")[0] == "id":
            field = id_argument + field[2:]
        if field == "user_id":  # the connection's key names the user: no argument to name
            field = None
        raise Refused(str(err) if field is None else f"{field}: {err}", status_of(err), field) from None


def _takes_text(annotation: Any) -> bool:
    """Whether an argument of this type may be a string (``str``, ``Annotated[str, ...]``, or a
    union with one of them)."""
    if annotation is str:
        return True
    if get_origin(annotation) is Annotated:
        return _takes_text(get_args(annotation)[0])
    return get_origin(annotation) in (Union, types.UnionType) and any(map(_takes_text, get_args(annotation)))


class VerbatimText(FuncMetadata):
    """A tool's arguments as the SDK reads them, but for one step: the SDK decodes a string given
    for an argument not typed plain ``str`` as JSON (some clients send lists as JSON text). For an
    optional string that read the session id ``"null"`` as no session, so ``memory_forget`` forgot
    the whole user. Here a string stays as given unless the argument cannot be a string and the
    string is JSON of a list or an object, read as a body is (:mod:`retrieval.memory.strict_json`:
    a key given twice is refused, naming the argument)."""

    def pre_parse_json(self, data: dict[str, Any]) -> dict[str, Any]:
        fields, decoded = self.arg_model.model_fields, dict(data)
        for key, value in data.items():
            if not isinstance(value, str) or key not in fields or _takes_text(fields[key].annotation):
                continue
            try:
                parsed = strict_json.loads(value)
            except strict_json.JSONRefused as refused:
                raise Refused(f"{key}: {refused}", INVALID, key) from None
            except ValueError:
                continue  # not JSON: validation names the argument
            if isinstance(parsed, list | dict):
                decoded[key] = parsed
        return decoded


def _version() -> str:
    """The installed package's version, which a client reads in ``serverInfo``."""
    try:
        return metadata.version("isq-memory")
    except metadata.PackageNotFoundError:  # run from a checkout that was never installed
        return "unknown"


class StrictTools(MCPServer):
    """An MCP server whose tools check their arguments as the HTTP routes do: an argument a tool
    does not take (``user_id``, a misspelt ``limit``) is refused instead of dropped (and each
    tool's input schema says so), and a bad value is named as ``argument: message``, not in the
    SDK's multi-line validation report; a refusal is answered as :class:`Refused` says. It logs
    from warnings up: the SDK logs every refused call, with the values refused, at INFO."""

    def __init__(self, name: str, instructions: str, withheld: tuple[str, ...] = ()) -> None:
        super().__init__(name, instructions=instructions, version=_version(), log_level="WARNING")
        self.withheld = withheld  # the write tools of a read-only memory: not listed, refused

    def add_tool(self, fn: Callable[..., Any], name: str | None = None, *args: Any, **options: Any) -> None:
        """Register a tool whose string arguments are read verbatim (:class:`VerbatimText`), its
        description (its docstring, as the SDK takes it) as plain text: one line, code marked as
        markdown, not reST; the agent's model reads it to choose a tool. The SDK keeps its tools in
        a private manager, the one place this reaches into it."""
        super().add_tool(fn, name, *args, **options)
        tool = self._tool_manager.get_tool(name or fn.__name__)
        assert tool is not None
        tool.fn_metadata = VerbatimText(**dict(tool.fn_metadata))
        tool.description = _plain(tool.description or "")

    async def list_tools(self) -> list[Tool]:
        """The tools, their schemas' descriptions (the request models' docstrings) plain text too."""
        return [tool.model_copy(update={
            "input_schema": {**_plain_descriptions(tool.input_schema), "additionalProperties": False},
            "output_schema": _plain_descriptions(tool.output_schema)}) for tool in await super().list_tools()]

    async def get_prompt(self, name: str, arguments: dict[str, Any] | None = None,
                         context: Context | None = None) -> Any:
        """The memory has no prompts: a typed refusal that does not echo the name. The SDK's own
        answer raised, and its dispatcher logged the caller's name (up to a body's size, newlines
        and all) with two tracebacks at ERROR, once per request."""
        raise MCPError(INVALID_PARAMS, "name: no prompt (this server has none; it has tools)")

    async def read_resource(self, uri: Any, context: Context | None = None) -> Any:
        """The memory has no resources: refused as :meth:`get_prompt` is."""
        raise MCPError(INVALID_PARAMS, "uri: no resource (this server has none; it has tools)")

    async def call_tool(self, name: str, arguments: dict[str, Any], context: Context | None = None) -> Any:
        try:
            return await self._checked_call(name, arguments, context)
        except Refused as refused:
            return refused.result()
        except MCPError:  # a protocol error the SDK answers as such
            raise
        except Exception as exc:  # answered here, so the SDK neither logs it again nor hides the id
            cause = exc.__cause__ if isinstance(exc, ToolError) and exc.__cause__ is not None else exc
            request_id = logged_failure(f"in MCP tool {name!r}", cause)
            return Refused(internal_error(request_id), 500, request_id=request_id).result()

    async def _checked_call(self, name: str, arguments: dict[str, Any], context: Context | None) -> Any:
        listed = await super().list_tools()  # the schemas as made: this runs at every call
        taken = {tool.name: set(tool.input_schema.get("properties", {})) for tool in listed}
        if name in self.withheld:
            raise Refused(str(ReadOnly()), status_of(ReadOnly()))
        if name not in taken:
            raise Refused(f"name: no tool {name!r} (the tools: {', '.join(sorted(taken))})", 404, "name")
        unknown = sorted(set(arguments) - taken[name])
        if unknown:
            raise Refused(f"{unknown[0]}: Extra inputs are not permitted", INVALID, unknown[0])
        try:
            return await super().call_tool(name, arguments, context)
        except ToolError as err:  # the SDK's "Error executing tool ..." around the tool's own error
            if isinstance(err.__cause__, ValidationError):
                raise _invalid(err.__cause__) from None
            if isinstance(err.__cause__, Refused):
                raise err.__cause__ from None
            raise


def _plain(text: str) -> str:
    """A docstring as one line of plain text: its layout's line breaks and indentation gone, its
    reST code marks made markdown's."""
    return " ".join(text.split()).replace("``", "`")


def _plain_descriptions(schema: Any) -> Any:
    """A JSON schema with every ``description`` :func:`_plain`."""
    if isinstance(schema, dict):
        return {key: _plain(value) if key == "description" and isinstance(value, str)
                else _plain_descriptions(value) for key, value in schema.items()}
    if isinstance(schema, list):
        return [_plain_descriptions(value) for value in schema]
    return schema


def _invalid(err: ValidationError) -> Refused:
    first = err.errors()[0]
    field = ".".join(str(part) for part in first["loc"])
    return Refused(f"{field}: {first['msg']}", invalid_status(first), field)


def build_mcp(memory: Memory, gate: WriteGate, user_of: UserOf) -> MCPServer:
    """An MCP server whose tools act on ``memory`` for the user ``user_of`` names (those that read
    only, when the memory is read-only)."""
    read_only = memory.store.read_only
    server = StrictTools("isq-memory", READ_ONLY_INSTRUCTIONS if read_only else INSTRUCTIONS,
                         WRITE_TOOLS if read_only else ())

    @server.tool(description=ADD_DESCRIPTION,
                 annotations=ToolAnnotations(read_only_hint=False, destructive_hint=False))
    def memory_add(session_id: schemas.SessionId, turns: Annotated[list[schemas.TurnIn], Field(
            min_length=1, max_length=limits.MAX_TURNS)], ctx: Context,
            idempotency_key: schemas.ShortText | None = None) -> schemas.AddTurnsResponse:
        return _refusals(lambda: operations.add_turns(
            memory, gate, user_of(ctx), session_id,
            schemas.AddTurnsRequest(turns=turns, idempotency_key=idempotency_key)))

    @server.tool(annotations=ToolAnnotations(read_only_hint=True))
    def memory_search(query: schemas.Query, ctx: Context, k: schemas.K = limits.DEFAULT_K,
                      session_id: schemas.SessionId | None = None,
                      explain: schemas.Flag = False) -> schemas.SearchResponse:
        """Search the memory: the best-matching memories with their source turns (``explain``: how
        each was found)."""
        return _refusals(lambda: operations.search_response(operations.search(
            memory, user_of(ctx), schemas.SearchRequest(query=query, k=k, session_id=session_id,
                                                        explain=explain))))

    @server.tool(annotations=ToolAnnotations(read_only_hint=True))
    def memory_list(ctx: Context, session_id: schemas.SessionId | None = None,
                    limit: schemas.PageSize = limits.DEFAULT_PAGE,
                    cursor: schemas.ShortText | None = None) -> schemas.MemoryPage:
        """List stored records (extracted memories; raw turns are found by memory_search), oldest
        first; pass next_cursor back for the next page."""
        return _refusals(lambda: operations.list_memories(memory, user_of(ctx), session_id, limit, cursor))

    @server.tool(annotations=ToolAnnotations(read_only_hint=True))
    def memory_get(memory_id: schemas.MemoryId, ctx: Context) -> schemas.MemoryItem:
        """One stored record or raw turn by its id (a search hit's or a listed item's)."""
        return _refusals(lambda: operations.get_memory(memory, user_of(ctx), memory_id))

    @server.tool(annotations=ToolAnnotations(read_only_hint=True))
    def memory_history(memory_id: schemas.MemoryId, ctx: Context) -> schemas.History:
        """The records consolidation merged into this one (archived, each naming its successor)."""
        return _refusals(lambda: operations.history(memory, user_of(ctx), memory_id))

    @server.tool(annotations=ToolAnnotations(read_only_hint=False, destructive_hint=False))
    def memory_flush(session_id: schemas.SessionId, ctx: Context) -> schemas.Flushed:
        """Close the session's open segment now (call it when a conversation ends): its last turns
        become memories; returns their ids."""
        return _refusals(lambda: operations.flush(memory, gate, user_of(ctx), session_id))

    @server.tool(annotations=ToolAnnotations(read_only_hint=False, destructive_hint=True))
    def memory_delete(memory_id: schemas.MemoryId, ctx: Context) -> schemas.Deleted:
        """Delete one memory completely: a record goes with the turns it came from and everything
        derived from them (records of other turns stay); a raw turn with what derives from it."""
        return _refusals(lambda: operations.delete_memory(memory, gate, user_of(ctx), memory_id))

    @server.tool(annotations=ToolAnnotations(read_only_hint=False, destructive_hint=True))
    def memory_forget(ctx: Context, session_id: schemas.SessionId | None = None) -> schemas.Deleted:
        """Forget one session, or (without session_id) everything of this user."""
        return _refusals(lambda: operations.forget(memory, gate, user_of(ctx), session_id))

    @server.tool(annotations=ToolAnnotations(read_only_hint=False, destructive_hint=False))
    def memory_consolidate(ctx: Context, session_id: schemas.SessionId | None = None) -> schemas.Job:
        """Start consolidating (merging near-duplicate memories); returns the job and its status."""
        return _refusals(lambda: operations.consolidate(memory, gate, user_of(ctx), session_id))

    @server.tool(annotations=ToolAnnotations(read_only_hint=True))
    def memory_job(job_id: schemas.ShortText, ctx: Context) -> schemas.Job:
        """A consolidation job's status and progress (the job_id memory_consolidate returned)."""
        return _refusals(lambda: operations.job(memory, user_of(ctx), job_id), "job_id")

    for name in server.withheld:
        server.remove_tool(name)
    return server


def fixed_user(user_id: str) -> UserOf:
    """Every call is ``user_id``'s (stdio: the process belongs to one user)."""
    return lambda _: user_id


def key_user(ctx: Context) -> str:
    """The user :class:`~retrieval.service.auth.KeyGuard` put in the HTTP request's state."""
    request = ctx.request_context.request
    assert request is not None, "key_user serves HTTP calls only"
    return str(request.state.user_id)
