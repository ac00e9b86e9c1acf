"""The Experience Graph: attempts, strategies and lessons in Kùzu, and the maths that ranks them."""
