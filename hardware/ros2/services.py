"""ROS 2 services over Cyclone DDS, carried as rmw_cyclonedds_cpp carries them, so that ROS 2 nodes running
rmw_cyclonedds_cpp call our servers and answer our clients.

    client = ServiceClient(bridge, "/gripper/move/_action/cancel_goal", CANCEL_GOAL)
    response = client.call(CancelGoal_Request(), timeout=1.0)     # TimeoutError naming the service and deadline
    server = ServiceServer(bridge, "/reset", RESET, lambda request, request_id: RESET.Response(...))

The wire, as rmw_cyclonedds_cpp 3.2 (ros2/rmw_cyclonedds, rmw_cyclonedds_cpp/src) writes it:

- Topics (rmw_node.cpp, `rmw_init_cs` and `make_fqtopic`): service `/move` is DDS topic `rq/moveRequest` for
  requests and `rr/moveReply` for replies.
- Types (ServiceTypeSupport_impl.hpp): `<pkg>::srv::dds_::<Srv>_Request_` and `_Response_`; an action's services
  are `<pkg>::action::dds_::<A>_SendGoal_Request_` and so on (hardware/ros2/action_msgs.py).
- The request header (serdata.hpp `cdds_request_header_t {uint64_t guid; int64_t seq;}`, written by
  Serialization.cpp `serialize_top_level`): after the 4-byte encapsulation header, 8 bytes of `guid` and the
  int64 `seq`, both in the machine's byte order (little-endian on x86-64 and arm64, the "CDR_LE" ROS 2 uses),
  then the request or response itself in CDR, aligned from the byte after the encapsulation header (16 keeps
  every alignment). `guid` is the id of the client's request writer (rmw_send_request: `pubiid`, its instance
  handle; ours: the same) and `seq` numbers the client's requests from 1 (rmw_cyclonedds counts per process). A
  server answers with the request's `guid` and `seq` copied (rmw_send_response); every client of a service hears
  every reply and keeps those carrying its own `guid` (rmw_take_response: `srcfilter`), matched by `seq`.
- QoS: rmw_qos_profile_services_default, reliable, volatile, keep last 10.
- Pairing (rmw_init_cs, `get_unique_csid`, `check_for_response_reader`): a client's writer and reader carry the
  user data `clientid=<id>;` (a server's `serviceid=<id>;`), the id 16 bytes printed as hex joined by `.`.
  A server about to reply waits up to 100 ms for its reply writer to match the reader with the client id of the
  request's writer, so that a reply is not written before the client can hear it (the reply topic is volatile).
  A client here writes a request only once it has matched the server's request reader and reply writer.

Handlers run on the bridge's receive thread (as an rclpy executor runs callbacks): keep them short; a handler
that answers later returns None and calls `ServiceServer.reply` from another thread. These need the `dds`
backend: rclpy has services of its own.
"""

# No `from __future__ import annotations` here: the request and reply structs are built at runtime and
# cyclonedds reads their annotations as objects.

import dataclasses
import itertools
import logging
import threading
import time
import types
import typing
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from robotrl.hardware.ros2._deps import require_cyclonedds
from robotrl.hardware.ros2.bridge import Bridge, OnReceived, Received
from robotrl.hardware.ros2.names import full_topic_name
from robotrl.hardware.ros2.qos import QoSProfile

require_cyclonedds()

from cyclonedds.core import DDSException, Policy  # noqa: E402
from cyclonedds.idl import IdlStruct  # noqa: E402
from cyclonedds.idl.types import int64, uint64  # noqa: E402
from robotrl.hardware.ros2.action_msgs import ServiceType  # noqa: E402

log = logging.getLogger(__name__)

SERVICES_DEFAULT = QoSProfile(depth=10)
"""rmw_qos_profile_services_default: reliable, volatile, keep last 10."""
REPLY_MATCH_WAIT = 0.1  # seconds a server waits for the client's reply reader, as rmw_send_response does
_MASK64 = 0xFFFF_FFFF_FFFF_FFFF
_HEADER_FIELDS = ("rmw_guid", "rmw_seq")
_ids = itertools.count(1)  # client and service ids, as rmw_cyclonedds counts them per context
_ID_PREFIX = uuid.uuid4().bytes[:12]  # rmw_cyclonedds: its participant's GUID prefix; only uniqueness matters


@dataclass(frozen=True)
class RequestId:
    """Which request a reply answers: the client's `guid` and its request's `sequence`, as the header carries
    them; `writer` is the request writer's DDS instance handle (how a server finds the client's reader)."""

    guid: int
    sequence: int
    writer: int | None = None


class ServiceTimeoutError(TimeoutError):
    """A call not answered within its deadline; `service`, `timeout` (seconds) and `server_matched` (whether a
    server was matched at all) say which and why."""

    def __init__(self, service: str, timeout: float, server_matched: bool):
        self.service, self.timeout, self.server_matched = service, timeout, server_matched
        why = "a server was matched but did not answer" if server_matched else "no server for it was matched"
        super().__init__(f"service {service} did not answer within its deadline of {timeout:g} s ({why})")


def request_topic(service: str) -> str:
    """The DDS topic of a service's requests: `/move` -> `rq/moveRequest`."""
    return f"rq{full_topic_name(service)}Request"


def reply_topic(service: str) -> str:
    """The DDS topic of a service's replies: `/move` -> `rr/moveReply`."""
    return f"rr{full_topic_name(service)}Reply"


_sample_types: dict[type, type] = {}
_sample_types_lock = threading.Lock()


def sample_type(payload: type) -> type:
    """The struct a request or response of type `payload` travels as: rmw_cyclonedds's header (`rmw_guid`,
    uint64; `rmw_seq`, int64) then the payload's own fields, under the payload's DDS type name. Flat, so the
    bytes are the header's followed by the payload's."""
    if not (isinstance(payload, type) and issubclass(payload, IdlStruct)):
        raise TypeError(f"a request or response type must be a cyclonedds IdlStruct, got {payload!r}")
    with _sample_types_lock:
        cached = _sample_types.get(payload)
        if cached is not None:
            return cached
        hints = typing.get_type_hints(payload, include_extras=True)
        fields = dataclasses.fields(payload)
        clash = [f.name for f in fields if f.name in _HEADER_FIELDS]
        if clash:
            raise ValueError(f"{payload.__name__} has fields named as the request header's: {clash}")

        def body(namespace: dict) -> None:
            namespace["__annotations__"] = {"rmw_guid": uint64, "rmw_seq": int64} | {
                f.name: hints[f.name] for f in fields
            }
            namespace.update(rmw_guid=0, rmw_seq=0)
            for f in fields:
                has_default = f.default is not dataclasses.MISSING
                namespace[f.name] = dataclasses.field(
                    default=f.default if has_default else dataclasses.MISSING,
                    default_factory=f.default_factory if not has_default else dataclasses.MISSING,
                )
            namespace["__module__"] = __name__

        typename = payload.__idl_typename__  # the payload's own DDS name, as rmw_cyclonedds names the sample
        cls = dataclass(types.new_class(f"{payload.__name__}_Sample", (IdlStruct,), {"typename": typename}, body))
        _sample_types[payload] = cls
        return cls


def wrap(payload: Any, guid: int, sequence: int) -> Any:
    """`payload` as it travels: rmw_cyclonedds's request header (`guid`, `sequence`) in front of its fields."""
    cls = sample_type(type(payload))
    values = {f.name: getattr(payload, f.name) for f in dataclasses.fields(payload)}
    return cls(rmw_guid=guid & _MASK64, rmw_seq=sequence, **values)


def unwrap(sample: Any, payload: type) -> tuple[Any, int, int]:
    """The payload of a received sample, and its header's guid and sequence number."""
    values = {f.name: getattr(sample, f.name) for f in dataclasses.fields(payload)}
    return payload(**values), sample.rmw_guid, sample.rmw_seq


class PendingCall:
    """One request of a `ServiceClient`: answered, or not by its deadline. `done()` never blocks; `wait()` does,
    until the answer or the deadline; `result()` gives the response or raises `ServiceTimeoutError`."""

    def __init__(self, client: "ServiceClient", request: Any, sequence: int, timeout: float):
        self.client = client
        self.request = request
        self.sequence = sequence
        self.timeout = timeout
        self.started = time.monotonic()
        self.deadline = self.started + timeout
        self.sent = False
        self._response: Any = None
        self._answered = threading.Event()

    @property
    def service(self) -> str:
        return self.client.service

    def answered(self) -> bool:
        return self._answered.is_set()

    def expired(self) -> bool:
        return not self.answered() and time.monotonic() >= self.deadline

    def done(self) -> bool:
        """Answered, or the deadline passed (the request goes out here once the server is matched)."""
        if not self.sent and not self.answered():
            self.client._send_if_ready(self)
        return self.answered() or time.monotonic() >= self.deadline

    def wait(self, timeout: float | None = None) -> bool:
        """Block until answered or the deadline (or `timeout` seconds, if sooner); True if answered."""
        until = self.deadline if timeout is None else min(self.deadline, time.monotonic() + timeout)
        while not self.sent and not self.answered():
            if self.client._send_if_ready(self) or time.monotonic() >= until:
                break
            time.sleep(0.005)  # discovery has no event to wait on; matching takes milliseconds on one host
        return self._answered.wait(max(0.0, until - time.monotonic()))

    def result(self) -> Any:
        if self.answered():
            return self._response
        if time.monotonic() >= self.deadline:
            self.client._forget(self)
            raise ServiceTimeoutError(self.service, self.timeout, self.sent or self.client.server_ready())
        raise RuntimeError(f"the call to {self.service} is still waiting for its answer: wait() or done() first")

    def _answer(self, response: Any) -> None:
        self._response = response
        self._answered.set()


class ServiceClient:
    """Calls one ROS 2 service over the dds backend (rmw_cyclonedds_cpp's conventions, module docstring)."""

    def __init__(self, bridge: Bridge, service: str, srv_type: ServiceType, qos: QoSProfile = SERVICES_DEFAULT):
        self.service = full_topic_name(service)
        self.srv_type = _check_service_type(srv_type)
        self._bridge = _check_dds_bridge(bridge, self.service)
        user_data = f"clientid={_endpoint_id()};".encode()
        self._lock = threading.Lock()
        self._sequence = 0
        self._pending: dict[int, PendingCall] = {}
        self.stats = {"calls": 0, "answered": 0, "timeouts": 0, "late_replies": 0}
        self.last_answer_at: float | None = None  # time.monotonic() of the latest reply to this client
        # the reply reader first, so that it is matched when the first request goes out
        self._replies = bridge.dds_subscription(
            reply_topic(self.service),
            sample_type(srv_type.Response),
            _check_qos(qos),
            OnReceived(self._on_reply),
            user_data,
        )
        self._requests = bridge.dds_publisher(
            request_topic(self.service), sample_type(srv_type.Request), qos, user_data
        )
        self.guid = self._requests.writer.instance_handle & _MASK64
        self._closed = False

    def server_ready(self) -> bool:
        """A server's request reader and reply writer are both matched (rclpy's `service_is_ready`)."""
        return self._requests.subscription_count() > 0 and self._replies.publisher_count() > 0

    def wait_for_server(self, timeout: float) -> bool:
        deadline = time.monotonic() + check_deadline(timeout, self.service)
        while not self.server_ready():
            if time.monotonic() >= deadline:
                return False
            time.sleep(0.005)
        return True

    def call_async(self, request: Any, timeout: float) -> PendingCall:
        """Send `request` (once a server is matched, within `timeout`) and return at once; the `PendingCall`
        holds the answer when it comes, or says the deadline passed."""
        self._check_open()
        if not isinstance(request, self.srv_type.Request):
            raise TypeError(
                f"service {self.service} takes {self.srv_type.Request.__name__}, got {type(request).__name__}"
            )
        timeout = check_deadline(timeout, self.service)
        with self._lock:
            self._sequence += 1
            call = PendingCall(self, request, self._sequence, timeout)
            now = time.monotonic()
            for sequence in [s for s, c in self._pending.items() if c.deadline <= now]:
                self._drop(sequence)
            self._pending[call.sequence] = call
            self.stats["calls"] += 1
        self._send_if_ready(call)
        return call

    def call(self, request: Any, timeout: float) -> Any:
        """The response to `request`; a `ServiceTimeoutError` (a TimeoutError) naming the service and the
        deadline when none came within `timeout` seconds. Never call it from a subscription callback or a
        handler: the answer arrives on that thread."""
        call = self.call_async(request, timeout)
        call.wait()
        return call.result()

    def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        for endpoint in (self._requests, self._replies):
            self._bridge.close_dds_endpoint(endpoint)

    def _send_if_ready(self, call: PendingCall) -> bool:
        with self._lock:
            if call.sent:
                return True
            if self._closed or not self.server_ready() or time.monotonic() >= call.deadline:
                return False
            call.sent = True
        self._requests.publish(wrap(call.request, self.guid, call.sequence))
        return True

    def _forget(self, call: PendingCall) -> None:
        with self._lock:
            self._drop(call.sequence)

    def _drop(self, sequence: int) -> None:
        """An unanswered call past its deadline (under the lock): a reply that comes now counts as late."""
        if self._pending.pop(sequence, None) is not None:
            self.stats["timeouts"] += 1

    def _on_reply(self, received: Received) -> None:
        sample = received.msg
        if sample.rmw_guid != self.guid:
            return  # another client's reply: every client of a service hears every reply
        response, _, sequence = unwrap(sample, self.srv_type.Response)
        with self._lock:
            self.last_answer_at = time.monotonic()
            call = self._pending.pop(sequence, None)
            if call is None:
                self.stats["late_replies"] += 1
                return
            self.stats["answered"] += 1
        call._answer(response)

    def _check_open(self) -> None:
        if self._closed:
            raise RuntimeError(f"the client of service {self.service} is closed")


Handler = Callable[[Any, RequestId], Any]


class ServiceServer:
    """Serves one ROS 2 service over the dds backend. `handler(request, request_id)` returns the response, or
    None to answer later with `reply(request_id, response)` (from any thread); it runs on the bridge's receive
    thread. A handler that raises is logged and counted (`stats["handler_errors"]`), and that request gets no
    answer (the client's deadline reports it)."""

    def __init__(
        self,
        bridge: Bridge,
        service: str,
        srv_type: ServiceType,
        handler: Handler,
        qos: QoSProfile = SERVICES_DEFAULT,
    ):
        self.service = full_topic_name(service)
        self.srv_type = _check_service_type(srv_type)
        self._bridge = _check_dds_bridge(bridge, self.service)
        if not callable(handler):
            raise TypeError(f"the handler of service {self.service} must be callable, got {handler!r}")
        self._handler = handler
        self._closed = False
        self.stats = {"requests": 0, "replies": 0, "handler_errors": 0, "client_reader_unmatched": 0}
        self._stats_lock = threading.Lock()
        user_data = f"serviceid={_endpoint_id()};".encode()
        self._replies = bridge.dds_publisher(
            reply_topic(self.service), sample_type(srv_type.Response), _check_qos(qos), user_data
        )
        self._requests = bridge.dds_subscription(
            request_topic(self.service), sample_type(srv_type.Request), qos, OnReceived(self._on_request), user_data
        )

    def client_count(self) -> int:
        """How many clients' request writers are matched now."""
        return self._requests.publisher_count()

    def reply(self, request_id: RequestId, response: Any) -> None:
        """Answer the request `request_id` with `response` (a handler's deferred answer)."""
        if not isinstance(request_id, RequestId):
            raise TypeError(f"request_id must be a RequestId, got {request_id!r}")
        if not isinstance(response, self.srv_type.Response):
            raise TypeError(
                f"service {self.service} answers {self.srv_type.Response.__name__}, got {type(response).__name__}"
            )
        if self._closed:
            return
        if not self._wait_for_client_reader(request_id):
            with self._stats_lock:
                self.stats["client_reader_unmatched"] += 1
        self._replies.publish(wrap(response, request_id.guid, request_id.sequence))
        with self._stats_lock:
            self.stats["replies"] += 1

    def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        for endpoint in (self._requests, self._replies):
            self._bridge.close_dds_endpoint(endpoint)

    def _on_request(self, received: Received) -> None:
        if self._closed:
            return
        request, guid, sequence = unwrap(received.msg, self.srv_type.Request)
        request_id = RequestId(guid, sequence, received.publisher)
        with self._stats_lock:
            self.stats["requests"] += 1
        try:
            response = self._handler(request, request_id)
        except Exception:
            with self._stats_lock:
                self.stats["handler_errors"] += 1
            log.exception("the handler of service %s failed; request %d is not answered", self.service, sequence)
            return
        if response is not None:
            try:
                self.reply(request_id, response)
            except TypeError:
                with self._stats_lock:
                    self.stats["handler_errors"] += 1
                log.exception("the handler of service %s returned a bad response", self.service)

    def _wait_for_client_reader(self, request_id: RequestId) -> bool:
        """rmw_send_response's check: True once this reply writer has matched the reader of the client that
        wrote the request (by the `clientid` of both), or at once for a client without one; False after
        REPLY_MATCH_WAIT seconds without it."""
        if request_id.writer is None:
            return True
        deadline = time.monotonic() + REPLY_MATCH_WAIT
        while True:
            try:
                client = self._requests.reader.get_matched_publication_data(request_id.writer)
            except DDSException:
                return False  # the client's writer is gone
            client_id = _user_data_key(client, "clientid") if client is not None else None
            if client_id is None:
                return True
            for handle in self._replies.writer.get_matched_subscriptions():
                try:
                    reader = self._replies.writer.get_matched_subscription_data(handle)
                except DDSException:
                    continue
                if reader is not None and _user_data_key(reader, "clientid") == client_id:
                    return True
            if time.monotonic() >= deadline:
                return False
            time.sleep(0.01)


def _user_data_key(endpoint: Any, key: str) -> str | None:
    """`value` of `key=value;` in an endpoint's user data (rmw_cyclonedds's `get_user_data_key`)."""
    try:
        data = endpoint.qos[Policy.Userdata].data
    except (KeyError, AttributeError):
        return None
    for item in bytes(data).decode(errors="replace").split(";"):
        name, sep, value = item.partition("=")
        if sep and name == key:
            return value
    return None


def _endpoint_id() -> str:
    """A client or service id shaped as rmw_cyclonedds's (`get_unique_csid`: 12 bytes unique to the participant,
    theirs its GUID prefix, ours random per process; then a big-endian counter), printed as `csid_to_string`."""
    raw = _ID_PREFIX + next(_ids).to_bytes(4, "big")
    return ".".join([f"{raw[0]:02x}"] + [f"{b:x}" for b in raw[1:]])


def _check_dds_bridge(bridge: Bridge, service: str) -> Any:
    if getattr(bridge, "backend", None) != "dds" or not hasattr(bridge, "dds_subscription"):
        raise TypeError(
            f"service {service} needs a bridge of the dds backend (make_bridge('dds')), got "
            f"{getattr(bridge, 'backend', bridge)!r}; with rclpy use its own services"
        )
    return bridge


def _check_service_type(srv_type: ServiceType) -> ServiceType:
    if not isinstance(srv_type, ServiceType):
        raise TypeError(f"a ServiceType (hardware/ros2/action_msgs.py) is needed, got {srv_type!r}")
    return srv_type


def _check_qos(qos: QoSProfile) -> QoSProfile:
    if not isinstance(qos, QoSProfile):
        raise TypeError(f"qos must be a QoSProfile, got {qos!r}")
    return qos


def check_deadline(timeout: float, what: str) -> float:
    """`timeout` as seconds, or a ValueError naming `what` and the bad value."""
    if isinstance(timeout, bool) or not isinstance(timeout, (int, float)) or not 0 < timeout < float("inf"):
        raise ValueError(f"the deadline for {what} must be a finite number of seconds > 0, got {timeout!r}")
    return float(timeout)
