"""archive: stored catalog answers (archive_entries); calls: result_state and cache_state

Revision ID: 0010
Revises: 0008
"""
from alembic import op
import sqlalchemy as sa

revision = '0010'
down_revision = '0008'
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.add_column('calls', sa.Column('result_state', sa.String(length=16), nullable=True))
    op.add_column('calls', sa.Column('cache_state', sa.String(length=16), nullable=True))
    op.create_table('archive_entries',
    sa.Column('key', sa.String(length=64), nullable=False),
    sa.Column('endpoint', sa.String(length=200), nullable=False),
    sa.Column('org_id', sa.String(length=40), nullable=True),
    sa.Column('status', sa.Integer(), nullable=False),
    sa.Column('content_type', sa.String(length=300), nullable=True),
    sa.Column('body', sa.LargeBinary(), nullable=False),
    sa.Column('stored_at', sa.DateTime(timezone=True), server_default=sa.text('now()'), nullable=False),
    sa.Column('expires_at', sa.DateTime(timezone=True), nullable=False),
    sa.ForeignKeyConstraint(['org_id'], ['orgs.id'], name=op.f('fk_archive_entries_org_id_orgs'),
                            ondelete='CASCADE'),
    sa.PrimaryKeyConstraint('key', name=op.f('pk_archive_entries'))
    )
    op.create_index(op.f('ix_archive_entries_expires_at'), 'archive_entries', ['expires_at'], unique=False)


def downgrade() -> None:
    op.drop_index(op.f('ix_archive_entries_expires_at'), table_name='archive_entries')
    op.drop_table('archive_entries')
    op.drop_column('calls', 'cache_state')
    op.drop_column('calls', 'result_state')
