"""The bridge over Cyclone DDS, speaking ROS 2's wire protocol without a ROS install.

ROS 2 nodes (rmw_cyclonedds, rmw_fastrtps) see these topics as their own: DDS topic `rt/<name>`, type
`<pkg>::msg::dds_::<Type>_`, samples in XCDR1 little-endian ("CDR_LE"), keyless. One receive thread per
bridge waits on all its readers (as an rclpy executor would) and fills the subscriptions' queues.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, TypeVar

from robotrl.hardware.ros2._deps import require_cyclonedds
from robotrl.hardware.ros2.bridge import Bridge, Publisher, Subscription
from robotrl.hardware.ros2.names import dds_topic_name
from robotrl.hardware.ros2.qos import Durability, QoSProfile, Reliability

require_cyclonedds()

from cyclonedds.core import (  # noqa: E402
    DDSException,
    GuardCondition,
    InstanceState,
    Policy,
    Qos,
    ReadCondition,
    SampleState,
    ViewState,
    WaitSet,
)
from cyclonedds.domain import Domain, DomainParticipant  # noqa: E402
from cyclonedds.idl import IdlStruct  # noqa: E402
from cyclonedds.pub import DataWriter  # noqa: E402
from cyclonedds.sub import DataReader  # noqa: E402
from cyclonedds.topic import Topic  # noqa: E402
from cyclonedds.util import duration  # noqa: E402

M = TypeVar("M")

# Lab machines' default interface may reach the robot network; `lo` has no multicast on Linux, so discovery
# goes by unicast to the local ports of participant indices 0..MaxAutoParticipantIndex (one per process).
LOOPBACK_CONFIG = """<CycloneDDS xmlns="https://cdds.io/config">
  <Domain Id="any">
    <General>
      <Interfaces><NetworkInterface name="lo"/></Interfaces>
      <AllowMulticast>false</AllowMulticast>
    </General>
    <Discovery>
      <ParticipantIndex>auto</ParticipantIndex>
      <MaxAutoParticipantIndex>64</MaxAutoParticipantIndex>
      <Peers><Peer address="127.0.0.1"/></Peers>
    </Discovery>
  </Domain>
</CycloneDDS>"""

_RECEIVE_POLL_NS = duration(milliseconds=200)  # how often the receive thread looks at its stop flag
_TAKE_BATCH = 256


def dds_qos(profile: QoSProfile) -> Qos:
    reliability = (
        Policy.Reliability.Reliable(max_blocking_time=duration(milliseconds=100))
        if profile.reliability is Reliability.RELIABLE
        else Policy.Reliability.BestEffort
    )
    durability = (
        Policy.Durability.TransientLocal
        if profile.durability is Durability.TRANSIENT_LOCAL
        else Policy.Durability.Volatile
    )
    # XCDR1 only: ROS 2 (Humble, Jazzy) writes and reads plain CDR; a reader or writer that also offers
    # XCDR2 would let cyclonedds pick XCDR2 for some types, which rmw_cyclonedds readers do not accept.
    representation = Policy.DataRepresentation(use_cdrv0_representation=True)
    return Qos(reliability, durability, Policy.History.KeepLast(profile.depth), representation)


@dataclass
class _DomainUse:
    loopback: bool
    domain: Domain | None  # None: Cyclone's own configuration (CYCLONEDDS_URI or its defaults)
    users: int = 0


# Cyclone DDS holds one configuration per domain id and process, so bridges on one id share it.
_domains: dict[int, _DomainUse] = {}
_domains_lock = threading.Lock()


def _join_domain(domain_id: int, loopback: bool) -> DomainParticipant:
    with _domains_lock:
        use = _domains.get(domain_id)
        if use is not None and use.loopback != loopback:
            raise RuntimeError(
                f"domain {domain_id} is already open in this process with loopback={use.loopback}; "
                f"Cyclone DDS allows one configuration per domain and process, so loopback={loopback} "
                "needs another domain id or process"
            )
        if use is None:
            try:
                domain = Domain(domain_id, LOOPBACK_CONFIG) if loopback else None
            except DDSException as error:
                raise RuntimeError(
                    f"cannot configure DDS domain {domain_id} for loopback: something in this process already "
                    f"uses it with another configuration ({error})"
                ) from error
            use = _domains[domain_id] = _DomainUse(loopback, domain)
        participant = DomainParticipant(domain_id)
        use.users += 1
        return participant


def _leave_domain(domain_id: int, participant: DomainParticipant) -> None:
    with _domains_lock:
        _delete(participant)
        use = _domains[domain_id]
        use.users -= 1
        if use.users == 0:
            if use.domain is not None:
                _delete(use.domain)
            del _domains[domain_id]


def _delete(entity: Any) -> None:
    # cyclonedds deletes an entity (and its children) in __del__; calling it now frees the DDS resources at
    # close() instead of whenever the garbage collector runs. It is idempotent.
    entity.__del__()


class DdsPublisher(Publisher[M]):
    def __init__(self, topic: str, msg_type: type[M], qos: QoSProfile, writer: DataWriter):
        super().__init__(topic, msg_type, qos)
        self._writer = writer

    def _publish(self, msg: M) -> None:
        try:
            self._writer.write(msg)
        except DDSException:
            raise
        except Exception as error:  # cyclonedds reports a value that does not fit its field this way
            raise ValueError(f"cannot publish {self.msg_type.__name__} on {self.topic}: {error}") from error

    @property
    def writer(self) -> DataWriter:
        """The DDS writer (services read its instance handle and its matched readers' user data)."""
        return self._writer

    def subscription_count(self) -> int:
        return self._writer.get_publication_matched_status().current_count

    def wait_for_all_acked(self, timeout: float) -> bool:
        try:
            return self._writer.wait_for_acks(duration(seconds=timeout))
        except AttributeError:
            # cyclonedds 11.0.1 compares the timeout code with a name that does not exist and raises this
            return False


class DdsSubscription(Subscription[M]):
    def __init__(
        self,
        topic: str,
        msg_type: type[M],
        qos: QoSProfile,
        callback: Callable[[M], Any] | None,
        reader: DataReader,
    ):
        super().__init__(topic, msg_type, qos, callback)
        self._reader = reader
        self.condition = ReadCondition(reader, SampleState.Any | ViewState.Any | InstanceState.Any)
        self._draining = threading.Lock()  # the receive thread and poll() callers take in turn, in order

    @property
    def reader(self) -> DataReader:
        """The DDS reader (services read their matched writers' user data)."""
        return self._reader

    def publisher_count(self) -> int:
        return self._reader.get_subscription_matched_status().current_count

    def matched_publishers(self) -> set[int]:
        return {_handle(handle) for handle in self._reader.get_matched_publications()}

    def drain(self) -> None:
        """Take everything the reader holds into the queue (the receive thread, and `poll`)."""
        with self._draining:
            while samples := self._reader.take(N=_TAKE_BATCH):
                for sample in samples:
                    if isinstance(sample, self.msg_type):  # not a lifecycle note (writer gone, disposed)
                        info = sample.sample_info
                        self._deliver(sample, info.source_timestamp / 1e9, _handle(info.publication_handle))
                if len(samples) < _TAKE_BATCH:
                    return

    def poll(self) -> None:
        self.drain()


class _ReceiveThread(threading.Thread):
    def __init__(self, participant: DomainParticipant):
        super().__init__(name="robotrl-dds-receive", daemon=True)
        self._waitset = WaitSet(participant)
        self._wake = GuardCondition(participant)
        self._waitset.attach(self._wake)
        self._subscriptions: list[DdsSubscription] = []
        self._lock = threading.Lock()
        self._stopping = False

    def add(self, subscription: DdsSubscription) -> None:
        with self._lock:
            self._subscriptions.append(subscription)
        self._waitset.attach(subscription.condition)
        self._wake.set(True)

    def remove(self, subscription: DdsSubscription) -> None:
        with self._lock:
            if subscription not in self._subscriptions:
                return
            self._subscriptions.remove(subscription)
        self._waitset.detach(subscription.condition)

    def run(self) -> None:
        while not self._stopping:
            self._waitset.wait(_RECEIVE_POLL_NS)
            self._wake.take()
            with self._lock:
                subscriptions = list(self._subscriptions)
            for subscription in subscriptions:
                subscription.drain()

    def stop(self) -> None:
        self._stopping = True
        self._wake.set(True)
        if self.is_alive():
            self.join(timeout=5.0)


class DdsBridge(Bridge):
    backend = "dds"

    def __init__(self, domain_id: int, loopback: bool = True):
        super().__init__(domain_id)
        self.loopback = loopback
        self._participant = _join_domain(domain_id, loopback)
        self._topics: dict[str, Topic] = {}
        self._receiver: _ReceiveThread | None = None
        self._lock = threading.Lock()

    def _topic(self, topic: str, msg_type: type, name: str | None = None) -> Topic:
        name = dds_topic_name(topic) if name is None else name
        with self._lock:
            existing = self._topics.get(name)
            if existing is None:
                existing = self._topics[name] = Topic(self._participant, name, msg_type)
            elif existing.data_type is not msg_type:
                raise TypeError(
                    f"topic {topic} already carries {existing.data_type.__name__} on this bridge, "
                    f"not {msg_type.__name__}"
                )
            return existing

    def _create_publisher(self, topic: str, msg_type: type[M], qos: QoSProfile) -> DdsPublisher[M]:
        writer = DataWriter(self._participant, self._topic(topic, msg_type), qos=dds_qos(qos))
        return DdsPublisher(topic, msg_type, qos, writer)

    def _create_subscription(
        self, topic: str, msg_type: type[M], qos: QoSProfile, callback: Callable[[M], Any] | None
    ) -> DdsSubscription[M]:
        reader = DataReader(self._participant, self._topic(topic, msg_type), qos=dds_qos(qos))
        return self._receive(DdsSubscription(topic, msg_type, qos, callback, reader))

    def _receive(self, subscription: DdsSubscription[M]) -> DdsSubscription[M]:
        with self._lock:
            if self._receiver is None:
                self._receiver = _ReceiveThread(self._participant)
                self._receiver.start()
        self._receiver.add(subscription)
        return subscription

    def dds_publisher(
        self, dds_topic: str, msg_type: type[M], qos: QoSProfile, user_data: bytes | None = None
    ) -> DdsPublisher[M]:
        """A writer on the DDS topic `dds_topic` as named on the wire (`rq/<service>Request`, `rt/<action>/_action/
        status`), of any IdlStruct: what services and actions build on (hardware/ros2/services.py). `user_data`
        goes into the writer's QoS (rmw_cyclonedds pairs a client's or service's two endpoints by it)."""
        self._check_open()
        _check_dds_endpoint(dds_topic, msg_type)
        writer = DataWriter(
            self._participant, self._topic(dds_topic, msg_type, dds_topic), qos=_with_user_data(qos, user_data)
        )
        return DdsPublisher(dds_topic, msg_type, qos, writer)

    def dds_subscription(
        self,
        dds_topic: str,
        msg_type: type[M],
        qos: QoSProfile,
        callback: Callable[[M], Any] | None = None,
        user_data: bytes | None = None,
    ) -> DdsSubscription[M]:
        """A reader on the DDS topic `dds_topic` as named on the wire, fed by this bridge's receive thread (as
        `subscription`'s); `callback` may be an `OnReceived`. See `dds_publisher`."""
        self._check_open()
        _check_dds_endpoint(dds_topic, msg_type)
        reader = DataReader(
            self._participant, self._topic(dds_topic, msg_type, dds_topic), qos=_with_user_data(qos, user_data)
        )
        return self._receive(DdsSubscription(dds_topic, msg_type, qos, callback, reader))

    def close_dds_endpoint(self, endpoint: DdsPublisher | DdsSubscription) -> None:
        """Delete one endpoint now, leaving the rest of the bridge open (a service or action closed before its
        bridge). Idempotent; closing the bridge deletes every endpoint anyway."""
        if self._closed:
            return
        if isinstance(endpoint, DdsSubscription):
            if self._receiver is not None:
                self._receiver.remove(endpoint)
            with endpoint._draining:  # not while the receive thread takes from it
                _delete(endpoint.condition)
                _delete(endpoint.reader)
        elif isinstance(endpoint, DdsPublisher):
            _delete(endpoint.writer)
        else:
            raise TypeError(f"expected a DdsPublisher or DdsSubscription, got {endpoint!r}")

    def _close(self) -> None:
        if self._receiver is not None:
            self._receiver.stop()
        _leave_domain(self.domain_id, self._participant)


def _check_dds_endpoint(dds_topic: str, msg_type: type) -> None:
    if not isinstance(dds_topic, str) or not dds_topic or dds_topic.startswith("/"):
        raise ValueError(f"a DDS topic name such as 'rq/add_twoRequest' is needed, got {dds_topic!r}")
    if not (isinstance(msg_type, type) and issubclass(msg_type, IdlStruct)):
        raise TypeError(f"the type on DDS topic {dds_topic} must be a cyclonedds IdlStruct, got {msg_type!r}")


def _with_user_data(profile: QoSProfile, user_data: bytes | None) -> Qos:
    qos = dds_qos(profile)
    if user_data is None:
        return qos
    if not isinstance(user_data, bytes):
        raise TypeError(f"user_data must be bytes or None, got {user_data!r}")
    return Qos(*qos, Policy.Userdata(user_data))


def _handle(handle: int) -> int:
    """An instance handle as one number: sample infos give it unsigned, get_matched_publications signed."""
    return handle & 0xFFFF_FFFF_FFFF_FFFF
