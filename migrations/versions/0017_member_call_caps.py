"""Member call caps: members.calls_per_day, member_calls

A member's cap on calls a UTC day (any tier, billed or not) and the calls a capped member made each day,
counted and checked by one conditional upsert (treg/call_caps.py, docs/money.md "Call caps").

Revision ID: 0017
Revises: 0016
"""
from alembic import op
import sqlalchemy as sa

revision = '0017'
down_revision = '0016'
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.add_column('members', sa.Column('calls_per_day', sa.Integer(), nullable=True))
    op.create_table('member_calls',
    sa.Column('member_id', sa.String(length=40), nullable=False),
    sa.Column('day', sa.Date(), nullable=False),
    sa.Column('org_id', sa.String(length=40), nullable=False),
    sa.Column('calls', sa.Integer(), nullable=False),
    sa.ForeignKeyConstraint(['member_id'], ['members.id'], name=op.f('fk_member_calls_member_id_members'),
                            ondelete='CASCADE'),
    sa.ForeignKeyConstraint(['org_id'], ['orgs.id'], name=op.f('fk_member_calls_org_id_orgs'), ondelete='CASCADE'),
    sa.PrimaryKeyConstraint('member_id', 'day', name=op.f('pk_member_calls'))
    )


def downgrade() -> None:
    op.drop_table('member_calls')
    op.drop_column('members', 'calls_per_day')
