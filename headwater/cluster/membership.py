"""A broker's membership of a cluster: which cluster it belongs to, and its registration.

A broker started with ``--zookeeper`` first makes sure it is talking to its own cluster: the
data directory remembers the cluster id and the broker id it joined with (``cluster.json``,
as Kafka's ``meta.properties``), and ``/cluster`` in ZooKeeper holds the cluster's id. A
directory of another cluster, or a chroot holding no cluster (a wrong chroot), is refused
naming both. Then it registers ``/brokers/<id>``, an ephemeral node: its creation zxid is the
**broker epoch**, new at every registration. A second broker with the same id finds the node
held by another data directory and is refused, naming the address that holds it; the same
broker restarted before its old session expired finds its own old registration and waits for
it to go.

While its session lives the broker is *active*. When the session is lost, or the connection
stays down for a whole session timeout (the server has expired it by then, though the client
cannot hear so while cut off), the broker stops acting on cluster state; with a new session it
registers again, at a new epoch, and is active again. :meth:`Membership.on_change` tells the
broker each change.
"""

from __future__ import annotations

import logging
import threading
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import msgspec

from headwater.cluster.coordination import (
    Coordination,
    CoordinationError,
    NodeExistsError,
    NoNodeError,
    SessionState,
)
from headwater.cluster.records import (
    DEFAULT_CHROOT,
    FORMAT_VERSION,
    BrokerRecord,
    ClusterRecord,
    RecordError,
    decode,
    encode,
    paths,
)
from headwater.errors import ClusterError, InvalidArgumentError
from headwater.storage.segment import write_atomically

__all__ = [
    "CLUSTER_FILE",
    "BROKER_ID_MAX",
    "BrokerIdTakenError",
    "ClusterIdentityError",
    "DataIdentity",
    "Membership",
    "ZooKeeperAddress",
]

log = logging.getLogger("headwater.cluster")

CLUSTER_FILE = "cluster.json"  # in the data directory: the cluster and broker it belongs to
BROKER_ID_MAX = 2**31 - 1


class ClusterIdentityError(ClusterError):
    """This data directory, broker id and ZooKeeper path do not belong together."""

    code = 82


class BrokerIdTakenError(ClusterError):
    """Another broker is registered with this broker id."""

    code = 83


@dataclass(frozen=True)
class ZooKeeperAddress:
    """``--zookeeper HOST:PORT[,HOST:PORT...][/chroot]``; the chroot is ``/headwater`` when
    none is given, so that a cluster never spreads over the root of a shared ensemble."""

    hosts: str
    chroot: str

    @classmethod
    def parse(cls, text: str) -> ZooKeeperAddress:
        raw = text.strip()
        if "://" in raw:
            raise InvalidArgumentError(
                f"zookeeper {text!r} has a scheme: give HOST:PORT[,HOST:PORT...][/chroot], as 127.0.0.1:2181"
            )
        hosts, slash, chroot = raw.partition("/")
        chroot = "/" + chroot.strip("/") if slash else DEFAULT_CHROOT
        if not hosts:
            raise InvalidArgumentError(f"zookeeper {text!r} names no server: give HOST:PORT[,HOST:PORT...][/chroot]")
        for one in hosts.split(","):
            host, colon, port = one.strip().rpartition(":")
            if not colon or not host or not port.isdigit() or not 0 < int(port) < 65536:
                raise InvalidArgumentError(
                    f"zookeeper server {one!r} in {text!r} is not HOST:PORT (for example 127.0.0.1:2181)"
                )
        if chroot == "/" or "//" in chroot or any(part in (".", "..") for part in chroot.split("/")):
            raise InvalidArgumentError(f"zookeeper chroot {chroot!r} in {text!r} must be a path such as /headwater")
        return cls(hosts, chroot)

    def __str__(self) -> str:
        return self.hosts + self.chroot


class DataIdentity(msgspec.Struct, frozen=True, kw_only=True):
    """``<data>/cluster.json``: the cluster and broker id a data directory joined with."""

    cluster_id: str
    broker_id: int

    @classmethod
    def read(cls, data_dir: Path) -> DataIdentity | None:
        path = data_dir / CLUSTER_FILE
        try:
            raw = path.read_bytes()
        except FileNotFoundError:
            return None
        try:
            return msgspec.json.decode(raw, type=cls)
        except msgspec.DecodeError as e:
            raise ClusterIdentityError(
                f"{path} is damaged ({e}); it names the cluster this directory belongs to: restore it, "
                f"or remove it to join this directory to the cluster ZooKeeper names"
            ) from None

    def write(self, data_dir: Path) -> None:
        write_atomically(data_dir / CLUSTER_FILE, msgspec.json.encode(self))


class Membership:
    """The broker's membership over one :class:`Coordination` session (see the module's
    docstring). :meth:`join` blocks until registered; the rest follows session events."""

    def __init__(
        self,
        coord: Coordination,
        *,
        where: str,
        record: BrokerRecord,
        data_dir: Path,
        session_timeout_s: float,
        stale_wait_s: float,
    ) -> None:
        self._coord = coord
        self._where = where  # the ZooKeeper address, for messages
        self.record = record
        self._data_dir = data_dir
        self._session_timeout_s = session_timeout_s
        self._stale_wait_s = stale_wait_s
        self._lock = threading.Lock()
        self._listeners: list[Callable[[bool, int], None]] = []
        self.cluster_id = ""
        self._epoch = 0  # the creation zxid of our registration; 0 while not registered
        self._registered_session = 0
        self._active = False
        self._closed = False
        self._joined = False  # session events before join() finishes are join()'s to handle
        self._cut_off: threading.Timer | None = None  # runs out a session timeout after SUSPENDED

    @property
    def coordination(self) -> Coordination:
        """The session the membership lives in (the broker's one session with ZooKeeper)."""
        return self._coord

    @property
    def broker_id(self) -> int:
        return self.record.broker_id

    @property
    def epoch(self) -> int:
        """The broker epoch: the creation zxid of the current registration (0: none)."""
        return self._epoch

    @property
    def active(self) -> bool:
        """Registered, with a live session: the broker may act on cluster state."""
        return self._active

    def on_change(self, callback: Callable[[bool, int], None]) -> None:
        """Call ``callback(active, epoch)`` at every change of either (on a coordination
        thread: it must not block)."""
        with self._lock:
            self._listeners.append(callback)

    def join(self) -> None:
        """Check the cluster's identity, then register; return once registered."""
        self._coord.on_session(self._on_session)  # before registering: no event may slip by
        self.cluster_id, remembered = self._check_cluster()
        self._register()
        if not remembered:  # only once it is a member: a refused start leaves the directory as it was
            DataIdentity(cluster_id=self.cluster_id, broker_id=self.broker_id).write(self._data_dir)
        with self._lock:
            self._joined = True
            moved_on = self._coord.session_id != self._registered_session
        if moved_on:  # the session was replaced while joining: the registration went with it
            self._set(False, 0)
            self._start_registering()

    def leave(self) -> None:
        """Remove the registration now (rather than after the session timeout) and stop."""
        with self._lock:
            self._closed = True
            if self._cut_off is not None:
                self._cut_off.cancel()
        self._set(False, self._epoch)
        try:
            stat = self._coord.exists(paths.broker(self.broker_id))
            if stat is not None and stat.ephemeral_owner == self._coord.session_id:
                self._coord.delete(paths.broker(self.broker_id), stat.version)
        except CoordinationError as e:  # the session's end removes it anyway
            log.debug("leaving: %s", e)

    def status(self) -> dict[str, object]:
        return {
            "cluster_id": self.cluster_id,
            "broker_id": self.broker_id,
            "broker_epoch": self._epoch,
            "zookeeper": self._where,
            "active": self._active,
        }

    # -- identity --------------------------------------------------------------------------

    def _check_cluster(self) -> tuple[str, bool]:
        """The cluster's id, and whether the data directory remembers it already."""
        local = DataIdentity.read(self._data_dir)
        if local is not None and local.broker_id != self.broker_id:
            raise ClusterIdentityError(
                f"the data directory {self._data_dir} belongs to broker {local.broker_id}, not broker "
                f"{self.broker_id}: start it with --broker-id {local.broker_id}, or give this broker "
                f"a data directory of its own"
            )
        try:
            raw, _ = self._coord.get(paths.CLUSTER)
        except NoNodeError:
            if local is not None:
                raise ClusterIdentityError(
                    f"the data directory {self._data_dir} belongs to cluster {local.cluster_id}, but ZooKeeper "
                    f"at {self._where} holds no cluster: is the chroot (the path after the servers in "
                    f"--zookeeper) the cluster's?"
                ) from None
            raw = self._create_cluster()
        remote = decode(raw, ClusterRecord, paths.CLUSTER)
        if remote.format_version > FORMAT_VERSION:
            raise ClusterIdentityError(
                f"the cluster at {self._where} has format {remote.format_version}, newer than this broker "
                f"knows ({FORMAT_VERSION}): upgrade this broker"
            )
        if local is not None and local.cluster_id != remote.cluster_id:
            raise ClusterIdentityError(
                f"the data directory {self._data_dir} belongs to cluster {local.cluster_id}, but ZooKeeper at "
                f"{self._where} holds cluster {remote.cluster_id}: is the chroot (the path after the "
                f"servers in --zookeeper) the cluster's?"
            )
        return remote.cluster_id, local is not None

    def _create_cluster(self) -> bytes:
        """Make ``/cluster`` with a new id, or read the one a broker starting beside us made."""
        record = ClusterRecord(cluster_id=uuid.uuid4().hex, created_ms=int(time.time() * 1000))
        try:
            self._coord.create(paths.CLUSTER, encode(record))
            log.info("made a new cluster %s at %s", record.cluster_id, self._where)
            return encode(record)
        except NodeExistsError:
            return self._coord.get(paths.CLUSTER)[0]

    # -- registration ----------------------------------------------------------------------

    def _register(self) -> None:
        path = paths.broker(self.broker_id)
        deadline = time.monotonic() + self._stale_wait_s
        told = False
        for parent in (paths.BROKERS,):
            try:
                self._coord.create(parent)
            except NodeExistsError:
                pass
        while True:
            session = self._coord.session_id
            try:
                self._coord.create(path, encode(self.record), ephemeral=True)
            except NodeExistsError:
                pass
            try:
                raw, stat = self._coord.get(path)
            except NoNodeError:
                continue  # it went between the create and the read: create again
            if stat.ephemeral_owner == session:
                break
            holder = self._holder(raw, path)
            if holder is None or holder.store_id != self.record.store_id:
                where = holder.address if holder is not None else "an unreadable registration"
                raise BrokerIdTakenError(
                    f"broker id {self.broker_id} is already registered in {self._where} by {where} "
                    f"(another data directory): give every broker its own --broker-id"
                )
            if time.monotonic() > deadline:
                raise BrokerIdTakenError(
                    f"broker {self.broker_id} is still registered by this data directory's previous process "
                    f"(ZooKeeper session {stat.ephemeral_owner:#x}), {self._stale_wait_s:g} s on: is another "
                    f"process serving it?"
                )
            if not told:
                told = True
                log.info(
                    "broker %d: waiting for the previous process's registration (session %#x) to expire",
                    self.broker_id,
                    stat.ephemeral_owner,
                )
            time.sleep(0.1)
        with self._lock:
            self._registered_session = session
        self._set(True, stat.created_zxid)
        log.info("broker %d registered in cluster %s at epoch %d", self.broker_id, self.cluster_id, stat.created_zxid)

    @staticmethod
    def _holder(raw: bytes, path: str) -> BrokerRecord | None:
        try:
            return decode(raw, BrokerRecord, path)
        except RecordError as e:
            log.warning("%s", e)
            return None

    def _set(self, active: bool, epoch: int) -> None:
        with self._lock:
            if (active, epoch) == (self._active, self._epoch):
                return
            self._active, self._epoch = active, epoch
            listeners = list(self._listeners)
        for fn in listeners:
            fn(active, epoch)

    # -- session events --------------------------------------------------------------------

    def _on_session(self, state: SessionState) -> None:
        with self._lock:
            if self._closed or not self._joined:
                return
            if self._cut_off is not None:
                self._cut_off.cancel()
                self._cut_off = None
            if state is SessionState.SUSPENDED:
                log.warning(
                    "broker %d: connection to ZooKeeper lost; reconnecting (the session lasts %g s)",
                    self.broker_id,
                    self._session_timeout_s,
                )
                # the server expires the session one timeout after it last heard from us; past
                # that, acting on what we believed would be acting on what may have changed
                self._cut_off = threading.Timer(self._session_timeout_s, self._run_out)
                self._cut_off.daemon = True
                self._cut_off.start()
                return
            same_session = self._registered_session != 0 and self._coord.session_id == self._registered_session
            if state is SessionState.LOST:
                self._registered_session = 0
        if state is SessionState.LOST:
            log.warning(
                "broker %d: ZooKeeper session lost; not acting on cluster state until a new one", self.broker_id
            )
            self._set(False, 0)
        elif same_session:
            self._set(True, self._epoch)
        else:
            # a new session: our registration went with the old one (the node may take a
            # moment to go, and then this is the wait for a previous process's)
            self._start_registering()

    def _start_registering(self) -> None:
        threading.Thread(target=self._register_again, name="headwater-register", daemon=True).start()

    def _run_out(self) -> None:
        log.warning(
            "broker %d: cut off from ZooKeeper for a session timeout (%g s); not acting on cluster state",
            self.broker_id,
            self._session_timeout_s,
        )
        self._set(False, self._epoch)

    def _register_again(self) -> None:
        try:
            self._register()
        except (CoordinationError, ClusterError) as e:
            log.error("broker %d could not register again: %s", self.broker_id, e)
