"""calls: failure_kind (treg's own unexpected exits) and parent_call_id (redirects, routed children)

Revision ID: 0003
Revises: 0002
"""
from alembic import op
import sqlalchemy as sa

revision = '0003'
down_revision = '0002'
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.add_column('calls', sa.Column('failure_kind', sa.String(length=32), nullable=True))
    op.add_column('calls', sa.Column('parent_call_id', sa.String(length=40), nullable=True))


def downgrade() -> None:
    op.drop_column('calls', 'parent_call_id')
    op.drop_column('calls', 'failure_kind')
