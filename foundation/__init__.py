"""The foundation: what every room of rolloutbus stands on.

Errors (one root), settings (``ROLLOUTBUS_*``, read once at an entry point), command-line flags, the
shape every command entry shares, the Kafka admin client and the ClickHouse client with its
migrations. Nothing here imports ``schemas``, ``producers``, ``streams``, ``trainer`` or the
``rolloutbus`` applications above them (``tests/unit/test_floors.py`` keeps it so).
"""
