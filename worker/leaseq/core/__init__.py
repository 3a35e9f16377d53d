"""The core: the faces over PostgreSQL (Queue, Workers, Leadership, Schema, Notifications)
and the types they take and return. Only this room touches the private store."""
