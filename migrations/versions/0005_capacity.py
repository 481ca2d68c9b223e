"""capacity: strikes and locks per lock key; overflow: daily spend and health marks per aggregator

Revision ID: 0005
Revises: 0004
"""
from alembic import op
import sqlalchemy as sa

revision = '0005'
down_revision = '0004'
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table('capacity_keys',
    sa.Column('key', sa.String(length=300), nullable=False),
    sa.Column('provider', sa.String(length=100), nullable=False),
    sa.Column('endpoint', sa.String(length=200), nullable=True),
    sa.Column('kind', sa.String(length=16), nullable=False),
    sa.Column('strikes', sa.Integer(), server_default=sa.text('0'), nullable=False),
    sa.Column('first_strike_at', sa.DateTime(timezone=True), nullable=True),
    sa.Column('last_strike_at', sa.DateTime(timezone=True), nullable=True),
    sa.Column('locked_since', sa.DateTime(timezone=True), nullable=True),
    sa.Column('locked_until', sa.DateTime(timezone=True), nullable=True),
    sa.Column('reset_stated', sa.Boolean(), server_default=sa.text('false'), nullable=False),
    sa.Column('updated_at', sa.DateTime(timezone=True), server_default=sa.text('now()'), nullable=False),
    sa.CheckConstraint("kind IN ('balance', 'quota')", name=op.f('ck_capacity_keys_kind')),
    sa.PrimaryKeyConstraint('key', name=op.f('pk_capacity_keys'))
    )
    op.create_table('overflow_spend',
    sa.Column('aggregator', sa.String(length=64), nullable=False),
    sa.Column('day', sa.Date(), nullable=False),
    sa.Column('spent_micro', sa.BigInteger(), server_default=sa.text('0'), nullable=False),
    sa.PrimaryKeyConstraint('aggregator', 'day', name=op.f('pk_overflow_spend'))
    )
    op.create_table('overflow_health',
    sa.Column('mark', sa.String(length=200), nullable=False),
    sa.Column('until', sa.DateTime(timezone=True), nullable=False),
    sa.Column('reason', sa.String(length=64), nullable=False),
    sa.Column('updated_at', sa.DateTime(timezone=True), server_default=sa.text('now()'), nullable=False),
    sa.PrimaryKeyConstraint('mark', name=op.f('pk_overflow_health'))
    )


def downgrade() -> None:
    op.drop_table('overflow_health')
    op.drop_table('overflow_spend')
    op.drop_table('capacity_keys')
