"""The faust guards refuse a faust or aiokafka they were not checked against, loudly."""

from __future__ import annotations

import pytest

from streams import faust_guards


def test_the_installed_versions_are_the_checked_ones() -> None:
    # Fails on an upgrade of faust-streaming or aiokafka: re-read the guarded code paths, run
    # tests/faults, then add the pair to faust_guards.CHECKED.
    faust_guards.check_versions()


def test_an_unchecked_version_is_refused_before_anything_is_patched(monkeypatch: pytest.MonkeyPatch) -> None:
    import faust
    from faust.transport import consumer as faust_consumer

    monkeypatch.setattr(faust, "__version__", "9.9.9")
    before = faust_consumer.Consumer._new_offset
    with pytest.raises(faust_guards.FaustGuardError, match="9.9.9.*not the versions"):
        faust_guards.install()
    assert faust_consumer.Consumer._new_offset is before


def test_a_guarded_function_that_changed_its_arguments_is_refused(monkeypatch: pytest.MonkeyPatch) -> None:
    from faust.transport.drivers import aiokafka as faust_aiokafka

    async def seek_to_committed(self: object, partitions: object) -> None: ...

    monkeypatch.setattr(faust_aiokafka.AIOKafkaConsumerThread, "seek_to_committed", seek_to_committed)
    with pytest.raises(faust_guards.FaustGuardError, match="seek_to_committed is gone or changed"):
        faust_guards.check_versions()


def test_a_drain_loop_that_no_longer_reads_the_read_offsets_is_refused(monkeypatch: pytest.MonkeyPatch) -> None:
    from faust.transport import consumer as faust_consumer

    async def _drain_messages(self: object, fetcher: object) -> None: ...

    monkeypatch.setattr(faust_consumer.Consumer, "_drain_messages", _drain_messages)
    with pytest.raises(faust_guards.FaustGuardError, match="_drain_messages no longer reads"):
        faust_guards.check_versions()


def test_a_record_too_large_to_send_fails_its_future_not_the_send_task() -> None:
    """aiokafka refuses a record over producer_max_request_size as faust hands it over: that ended faust's send
    task (ProducerBuffer._handle_pending), and the worker with it. Now the record's own future says so."""
    import asyncio
    from types import SimpleNamespace

    from aiokafka.errors import MessageSizeTooLargeError
    from faust.transport import producer as faust_producer
    from faust.types.tuples import FutureMessage

    faust_guards.install()

    from faust.exceptions import ProducerSendError

    class Channel:
        async def publish_message(self, fut: object, wait: bool = False) -> None:
            try:  # as faust's aiokafka driver passes aiokafka's refusal on
                raise MessageSizeTooLargeError("The message is 19000000 bytes when serialized")
            except MessageSizeTooLargeError as exc:
                raise ProducerSendError(f"Error while sending: {exc!r}") from exc

    async def send() -> FutureMessage:
        fut = FutureMessage(SimpleNamespace(channel=Channel()))  # type: ignore[arg-type]
        await faust_producer.ProducerBuffer._send_pending(object(), fut)  # returns: the task goes on
        return fut

    fut = asyncio.run(send())
    assert isinstance(fut.exception(), MessageSizeTooLargeError)  # what streams.groups_stage takes as refused for good

    class Broken:
        async def publish_message(self, fut: object, wait: bool = False) -> None:
            raise ProducerSendError("No transaction producer found for : x")

    async def other() -> None:
        await faust_producer.ProducerBuffer._send_pending(object(), FutureMessage(SimpleNamespace(channel=Broken())))  # type: ignore[arg-type]

    with pytest.raises(ProducerSendError):  # any other failure is not this guard's
        asyncio.run(other())
