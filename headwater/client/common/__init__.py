"""What the blocking and the asyncio client share, written once (see :mod:`.twins`)."""
